#!/usr/bin/env python3
"""Report dependency cycles among the C++ files under a folder.

The nodes are the .cpp files under ROOT (searched recursively). A header is
not a node of its own: it carries declarations from the .cpp files that
define them to the .cpp files that include it. There is an edge A -> B
(A != B, both .cpp files under ROOT) when

  * A includes (directly, `#include "..."`) a header H under ROOT that
    declares a function B defines, or a class B defines a method of, and
    A names that function or method (a header that declares many files'
    functions, such as a list of kernel builders, links only the files
    that call each other through it, not every file that includes it);
    `--any-include` drops the naming condition: including H is enough;
  * or A includes B's own header: X.h beside X.cpp, same folder, same stem.

Include paths are relative to the repository root (the folder above this
script's, or --repo), as in `#include "codegen/nvidia/kernels/Matmul.h"`, or else to the
including file's folder.

A heuristic, not a parser. Comments, string and character literals and
preprocessor lines are blanked first; braces are then followed to know the
scope of each statement:

  * declared in H: a statement ending in `;` at namespace scope (not inside
    a class, struct, enum or function body) of the form `Type name(...)`:
    the identifier before its first `(`, with a type before it; `using`,
    `typedef`, `friend` and `static_assert` statements are not declarations;
    a class or struct defined in H (with a body, at namespace scope) declares
    its methods;
  * defined in B: a head starting in column 0 at namespace scope (not in an
    anonymous namespace, not `static`) whose `(...)` is followed by a `{`
    body: `Type name(` or `Type ns::name(` (any namespace qualifier) defines
    the function `name`; `Type Class::method(` defines a method of `Class`
    when `Class` is a class or struct defined in one of the files read.

A free function matches when the namespace of its declaration ends with the
namespaces around its definition followed by its qualifiers (`nvidia::f`
beside `using namespace mlir::moe::nvidia` defines mlir::moe::nvidia::f); a
method matches by its class's name alone. A strongly connected component
of more than one file is a cycle: it is printed as a closed walk through all
of its files, `cycle: a.cpp -> b.cpp -> a.cpp`, followed by each edge of the
walk with the header that makes it and the names it carries.

Usage: include-cycles.py [--any-include] [--repo DIR] ROOT
Prints every cycle and exits 1 if there is any; else prints
`no cycles among N files` and exits 0.
"""

import argparse
import importlib.util
import os
import re
import sys
from collections import defaultdict, deque

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# Comments and literals are blanked as function-lengths.py blanks them
# (loaded without leaving bytecode beside it).
sys.dont_write_bytecode = True
_spec = importlib.util.spec_from_file_location(
    "function_lengths", os.path.join(HERE, "function-lengths.py"))
_lengths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lengths)
blank_comments_and_literals = _lengths.blank_comments_and_literals

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)
IDENT = re.compile(r"[A-Za-z_]\w*")
# The (qualified) name right before a parameter list.
NAME_BEFORE_PAREN = re.compile(
    r"((?:[A-Za-z_]\w*\s*(?:<[^<>()]*>)?\s*::\s*)*~?[A-Za-z_]\w*)\s*$")
CLASS_HEAD = re.compile(
    r"^(?:\[\[[^\]]*\]\]\s*)?(class|struct|union|enum)\b"
    r"(?:\s+(?:class|struct)\b)?\s*(?:\[\[[^\]]*\]\]\s*)?"
    r"(?:alignas\s*\([^)]*\)\s*)?([A-Za-z_]\w*)?")
NAMESPACE_HEAD = re.compile(r"^(?:inline\s+)?namespace\b\s*([\w:]*)")
EXTERN_C_HEAD = re.compile(r'^extern\s*"\s*"\s*$')
NOT_DECLARATIONS = ("using", "typedef", "friend", "static_assert",
                    "return", "template")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof",
            "alignas", "decltype", "catch", "static_assert", "noexcept",
            "throw", "new", "delete", "operator", "typeid", "defined",
            "__attribute__", "__declspec", "requires"}
# Ends of a constructor's head whose member initializers use braces.
CTOR_INIT = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:).*[\w>]\s*$")
ACCESS = re.compile(r"^(?:(?:public|protected|private)\s*:(?!:)\s*)+")


def blank_preprocessor(text):
    """Blanks preprocessor lines (and their continuations), keeping breaks."""
    lines = text.split("\n")
    continued = False
    for i, line in enumerate(lines):
        if continued or line.lstrip().startswith("#"):
            continued = line.endswith("\\")
            lines[i] = " " * len(line)
    return "\n".join(lines)


def strip_template_prefix(head):
    """`template <...> rest` -> `rest`, angle brackets balanced."""
    while True:
        m = re.match(r"\s*template\s*<", head)
        if not m:
            return head
        depth, i = 1, m.end()
        while i < len(head) and depth:
            depth += {"<": 1, ">": -1}.get(head[i], 0)
            i += 1
        head = head[i:]


def name_before_paren(head):
    """(qualifiers, name, start) of the name before the first `(`, or None.

    The first `(` outside template arguments; a name with no type before it
    (a macro, a constructor call) gives None.
    """
    angle = 0
    for i, c in enumerate(head):
        if c == "<":
            angle += 1
        elif c == ">" and angle:
            angle -= 1
        elif c == "(" and not angle:
            m = NAME_BEFORE_PAREN.search(head[:i])
            if not m:
                return None
            parts = [p.strip() for p in re.sub(r"<[^<>()]*>", "",
                                               m.group(1)).split("::")]
            if parts[-1] in KEYWORDS or not IDENT.search(head[:m.start()]):
                return None
            return parts[:-1], parts[-1], m.start()
    return None


class Source:
    """What one file includes, declares and defines."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8", errors="replace") as f:
            raw = f.read()
        blank = blank_comments_and_literals(raw)
        self.includes = []
        for m in INCLUDE.finditer(raw):
            # A directive in a comment is blanked: it does not count.
            if blank[m.start():m.end()].replace(" ", "").startswith(
                    "#include"):
                self.includes.append(m.group(1))
        code = blank_preprocessor(blank)
        self.identifiers = set(IDENT.findall(code))
        # Declared at namespace scope: (namespace, name), the namespace a
        # tuple of names ("mlir", "moe", "nvidia").
        self.functions = set()
        self.classes = set()  # defined (with a body) at namespace scope
        # Heads of bodies: (enclosing namespace, qualifiers, name, line).
        self.definitions = []
        self._scan(code)

    def _scan(self, code):
        # Scopes: "ns", "anon" (anonymous namespace), "class", "body" (a
        # function's, or any brace inside one) and "init" (a brace inside a
        # statement's head: a member initializer, a braced initializer);
        # the file itself is a namespace.
        stack = []
        names = []  # the names of the namespaces open, one entry per scope
        head_start = 0

        def at_namespace():
            return all(s in ("ns", "anon") for s in stack)

        def in_body():
            return any(s in ("body", "init") for s in stack)

        def namespace():
            return tuple(part for name in names for part in name)

        for i, c in enumerate(code):
            if c not in "{;}":
                continue
            text = ACCESS.sub("", " ".join(code[head_start:i].split()))
            if c == "{":
                if in_body():
                    stack.append("body")
                    continue
                bare = strip_template_prefix(text)
                ns = NAMESPACE_HEAD.match(bare)
                cls = CLASS_HEAD.match(bare)
                opened = ()
                if ns:
                    kind = "ns" if ns.group(1) else "anon"
                    opened = tuple(p for p in ns.group(1).split("::") if p)
                elif EXTERN_C_HEAD.match(bare):
                    kind = "ns"
                elif cls and "(" not in bare:
                    kind = "class"
                    if at_namespace() and cls.group(1) != "enum" and \
                            cls.group(2):
                        self.classes.add(cls.group(2))
                elif "(" in bare and not CTOR_INIT.search(bare):
                    kind = "body"
                    if at_namespace() and "anon" not in stack:
                        self._definition(code, head_start, i, bare,
                                         namespace())
                else:
                    # `Foo() : member{`, `int table[] = {`, `Foo foo{`: the
                    # brace belongs to the statement, which goes on after it.
                    stack.append("init")
                    continue
                stack.append(kind)
                names.append(opened)
                head_start = i + 1
            elif c == "}":
                kind = stack.pop() if stack else "ns"
                if names and len(names) > len(stack):
                    names.pop()
                if kind == "init" and not in_body():
                    continue
                head_start = i + 1
            elif not in_body():
                if at_namespace():
                    self._declaration(strip_template_prefix(text),
                                      namespace())
                head_start = i + 1

    def _declaration(self, text, namespace):
        first = IDENT.match(text)
        if not first or first.group(0) in NOT_DECLARATIONS:
            return
        found = name_before_paren(text)
        if found and not found[0] and "=" not in text[:found[2]]:
            self.functions.add((namespace, found[1]))

    def _definition(self, code, start, end, text, namespace):
        # The head's first character must be in column 0.
        offset = start
        while offset < end and code[offset] in " \t\n":
            offset += 1
        if offset >= end or (offset > 0 and code[offset - 1] != "\n"):
            return
        if re.match(r"(static|inline\s+static)\b", text):
            return
        found = name_before_paren(text)
        if found:
            line = code.count("\n", 0, offset) + 1
            self.definitions.append((namespace, found[0], found[1], line))


def rel(path):
    path = os.path.abspath(path)
    if path == REPO or path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO)
    return path


def resolve(include, source_path, known):
    for base in (REPO, os.path.dirname(source_path)):
        candidate = os.path.normpath(os.path.join(base, include))
        if candidate in known:
            return candidate
    return None


def declares(header, namespace, name):
    """Whether header declares a function `name` that a definition in
    `namespace` (its enclosing namespaces, then its qualifiers) defines: the
    declaration's namespace ends with that one (`nvidia::f` written beside
    `using namespace mlir::moe::nvidia` defines mlir::moe::nvidia::f); an
    unqualified definition outside any namespace defines only a global."""
    for declared, declared_name in header.functions:
        if declared_name != name:
            continue
        if not namespace and declared:
            continue
        if declared[len(declared) - len(namespace):] == namespace:
            return True
    return False


def build_graph(root, any_include):
    paths = []
    for folder, _, names in os.walk(root):
        paths += [os.path.abspath(os.path.join(folder, name))
                  for name in names if name.endswith((".h", ".cpp"))]
    sources = {p: Source(p) for p in sorted(paths)}
    cpps = [p for p in sources if p.endswith(".cpp")]
    every_class = set()
    for s in sources.values():
        every_class |= s.classes

    # What each header carries, and from which .cpp file: header -> cpp ->
    # names (functions by name; methods as Class::method).
    carried = defaultdict(lambda: defaultdict(set))
    for h in (p for p in sources if p.endswith(".h")):
        header = sources[h]
        for b in cpps:
            for namespace, qualifiers, name, _ in sources[b].definitions:
                owner = qualifiers[-1] if qualifiers else None
                if owner in every_class:
                    if owner in header.classes:
                        carried[h][b].add((owner + "::" + name, name))
                elif declares(header, namespace + tuple(qualifiers), name):
                    carried[h][b].add((name, name))

    # edges[a][b] = {header: names}
    edges = defaultdict(lambda: defaultdict(dict))
    for a in cpps:
        for include in sources[a].includes:
            h = resolve(include, a, sources)
            if not h or not h.endswith(".h"):
                continue
            for b, names in carried.get(h, {}).items():
                if b == a:
                    continue
                used = sorted(full for full, bare in names
                              if any_include or
                              bare in sources[a].identifiers)
                if used:
                    edges[a][b].setdefault(h, set()).update(used)
            own = h[:-2] + ".cpp"
            if own in sources and own != a:
                edges[a][own].setdefault(h, set())
    return cpps, edges


def components(nodes, edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                result.append(sorted(component))
    return result


def shortest_path(edges, members, source, target):
    previous = {source: None}
    queue = deque([source])
    while queue:
        node = queue.popleft()
        if node == target and node != source:
            break
        for child in sorted(edges.get(node, {})):
            if child in members and child not in previous:
                previous[child] = node
                queue.append(child)
    path = [target]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path[::-1]


def closed_walk(edges, component):
    """A closed walk from the first file through every file of component."""
    members = set(component)
    walk = [component[0]]
    for target in component[1:] + [component[0]]:
        if target in walk[1:] and target != component[0]:
            continue
        walk += shortest_path(edges, members, walk[-1], target)[1:]
    return walk


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--any-include", action="store_true",
                        help="an include of a header is an edge to every "
                        "file whose definitions it declares, named or not")
    parser.add_argument("--repo", help="the folder include paths are "
                        "relative to (default: the repository above this "
                        "script), to check another checkout's sources")
    parser.add_argument("root")
    args = parser.parse_args()
    if args.repo:
        global REPO
        REPO = os.path.abspath(args.repo)
    if not os.path.isdir(args.root):
        print("include-cycles.py: %s is not a folder" % args.root,
              file=sys.stderr)
        return 2

    cpps, edges = build_graph(args.root, args.any_include)
    cycles = [c for c in components(cpps, edges) if len(c) > 1]
    for component in sorted(cycles):
        walk = closed_walk(edges, component)
        print("cycle: " + " -> ".join(rel(p) for p in walk))
        for a, b in zip(walk, walk[1:]):
            for header, names in sorted(edges[a][b].items()):
                print("  %s -> %s: %s%s" % (
                    rel(a), rel(b), rel(header),
                    " (%s)" % ", ".join(sorted(names)) if names
                    else " (its own header)"))
    if cycles:
        return 1
    print("no cycles among %d files" % len(cpps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
