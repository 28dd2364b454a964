#!/usr/bin/env python3
"""Report C++ function bodies longer than a limit.

A heuristic, not a parser: a definition is a line starting in column 0 that
opens a brace block, and it ends at the `}` that closes that block, also in
column 0. Comments, string and character literals are blanked before braces
are counted, so braces inside them do not count. Lambdas and local classes
count toward the function that encloses them. Namespaces, classes, structs,
enums and `extern "C"` blocks are containers, not functions: what they hold
is looked at instead.

Usage: function-lengths.py [--max N] PATH...
Prints `file:line: name is L lines (limit N)` for each function over the
limit and exits 1 if there is any, 0 otherwise.
"""

import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".h", ".hpp", ".inc")
CONTAINER = re.compile(
    r'^\s*(template\s*<.*>\s*)?'
    r'((namespace|class|struct|union|enum)\b|extern\s+"[^"]*")|=\s*\{$')
CLASS = re.compile(r'^\s*(template\s*<.*>\s*)?(class|struct|union)\b')
ACCESS = re.compile(r'^(public|protected|private)\s*:$')


def blank_comments_and_literals(text):
    """Replaces comments and literals by spaces, keeping the line breaks."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == 'R' and text.startswith('R"', i) and (
                i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c in "\"'":
            # A quote right after a digit is a digit separator (1'000).
            if c == "'" and i > 0 and text[i - 1].isalnum():
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            end = min(j + 1, n)
            out.append(c + " " * (end - i - 2) + (c if end - i > 1 else ""))
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """Yields (first line, last line, head) of each column-0 definition."""
    lines = blank_comments_and_literals(text).split("\n")
    depth = 0
    # Open blocks: (depth inside it, start line, head, is container).
    stack = []
    head_start = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        at_top = depth == 0 or (stack and stack[-1][3])
        if depth == len(stack) and at_top and stripped and \
                stripped[0] not in "#}" and \
                not ACCESS.match(stripped) and head_start is None:
            # A declaration starts at a namespace's or a class's level:
            # in column 0 at file and namespace level, indented in a class.
            if line[:1] not in (" ", "\t") or CLASS.match(stack[-1][2]
                                                           if stack else ""):
                head_start = number
        for c in line:
            if c == "{":
                depth += 1
                if len(stack) == depth - 1 and head_start is not None:
                    head = " ".join(
                        l.strip() for l in lines[head_start - 1:number])
                    stack.append((depth, head_start, head,
                                  bool(CONTAINER.match(head))))
                    head_start = None
                elif len(stack) == depth - 1:
                    stack.append((depth, number, stripped, True))
            elif c == "}":
                if stack and stack[-1][0] == depth:
                    start_depth, start, head, container = stack.pop()
                    if not container:
                        yield start, number, head
                depth -= 1
            elif c == ";" and depth == len(stack):
                head_start = None
        if depth == len(stack) and stripped.endswith(";"):
            head_start = None


def name_of(head):
    """The qualified name before the parameter list, or the head itself."""
    before = head.split("(", 1)[0].split()
    return before[-1].lstrip("*&") if before else head


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=200,
                        help="longest body allowed, in lines (default 200)")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()

    files = []
    for path in args.paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                files += [os.path.join(root, name) for name in names
                          if name.endswith(SOURCE_SUFFIXES)]
        else:
            files.append(path)

    over = 0
    for path in sorted(files):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for start, end, head in functions(text):
            length = end - start + 1
            if length > args.max:
                over += 1
                print("%s:%d: %s is %d lines (limit %d)" %
                      (path, start, name_of(head), length, args.max))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
