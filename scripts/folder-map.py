#!/usr/bin/env python3
"""Checks docs/architecture.md's folder map against the tree.

The map is the table under the heading `## Folder map`: each row's first
cell names one or more folders as `path/`. The tree's folders are those of
the files git tracks (every folder on the way to one), or, outside a git
checkout, every folder but hidden ones (save .ci), build folders and
caches. A folder inside one named `Inputs` belongs to its test inputs and
needs no line of its own.

Usage: folder-map.py [ROOT]   (default: the repository above this script)
Prints each folder the tree has and the map lacks, and each the map names
and the tree lacks, and exits 1 if there is any; else prints
`folder map: N folders` and exits 0.
"""

import os
import re
import subprocess
import sys

HEADING = "## Folder map"


def map_folders(doc):
    folders, inside = set(), False
    for line in doc.splitlines():
        if line.startswith("## "):
            inside = line.strip() == HEADING
            continue
        if inside and line.startswith("|"):
            first = line.split("|")[1]
            folders |= {f.rstrip("/") for f in re.findall(r"`([^`]+/)`", first)}
    return folders


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [line for line in out.splitlines() if line]


def walked_files(root):
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs
                   if (not d.startswith(".") or d == ".ci")
                   and not d.startswith("build") and d != "__pycache__"
                   and not d.endswith(".egg-info")]
        rel = os.path.relpath(folder, root)
        files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    return files


def tree_folders(files):
    folders = set()
    for f in files:
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            if "Inputs" in parts[:i - 1]:
                break
            folders.add("/".join(parts[:i]))
    return folders


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    doc_path = os.path.join(root, "docs", "architecture.md")
    with open(doc_path) as f:
        named = map_folders(f.read())
    if not named:
        print("folder-map.py: %s has no '%s' table" % (doc_path, HEADING),
              file=sys.stderr)
        return 2
    files = tracked_files(root)
    tree = tree_folders(files if files is not None else walked_files(root))
    missing, stale = sorted(tree - named), sorted(named - tree)
    for folder in missing:
        print("not in the folder map: %s/" % folder)
    for folder in stale:
        print("in the folder map but not in the tree: %s/" % folder)
    if missing or stale:
        return 1
    print("folder map: %d folders" % len(tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())
