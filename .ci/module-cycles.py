#!/usr/bin/env python3
"""Prints the import cycles between the modules of src/ and exits 1 if there is one.

The graph is checked twice: between the top-level modules (`config`, `engine`, `source`,
`write`...; src/engine/run.rs belongs to `engine`), and between modules to the second level
(`config`, `engine::run`, `engine::object`, `source::client`...; src/source/client.rs and
anything below it is `source::client`).

An edge A -> B is a path in A's code that names an item of B: `use crate::…`, `crate::…` in
code, `super::…`, `self::…`, and `child::…` of a child module (in `use` or in code). Not edges:
`mod x;` declarations, comments, strings, `#[cfg(test)]` modules, and paths between a module and
a module that holds it (`engine::run` naming `engine`, or the reverse): a file and its parent are
one unit. A path through a re-export counts where it points: `crate::engine::Budget`, which
`engine` re-exports from `engine::run`, is an edge to `engine::run`.

Usage: python3 .ci/module-cycles.py [--edges]
"""

import argparse
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
CRATE_ROOTS = {"lib.rs", "main.rs"}


def strip(text):
    """Blanks comments, string and char literals, keeping line breaks (for line numbers)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:])):
            out.append(blank(m.group(0)))
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(code):
    """Blanks `#[cfg(test)] mod NAME { … }` blocks."""
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code))):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + "".join("\n" if c == "\n" else " " for c in code[m.start() : j]) + code[j:]
    return code


def expand_use(tree):
    """`a::{b, c::{d, e as f}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    pos = 0

    def parse():
        nonlocal pos
        prefix = []
        while pos < len(tree):
            m = re.match(r"(\w+|\*)(::)?", tree[pos:])
            if m:
                pos += m.end()
                prefix.append(m.group(1))
                if not m.group(2):
                    return [prefix]
            elif tree[pos] == "{":
                pos += 1
                paths = []
                while pos < len(tree) and tree[pos] != "}":
                    paths += [prefix + p for p in parse()]
                    if pos < len(tree) and tree[pos] == ",":
                        pos += 1
                pos += 1
                return paths
            else:
                return [prefix]
        return [prefix]

    return parse()


def module_files():
    """{module path tuple: file} for every file under src/."""
    mods = {}
    for dirpath, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            parts = rel[:-3].split(os.sep)
            if rel in CRATE_ROOTS:
                continue
            if parts[-1] == "mod":
                parts = parts[:-1]
            mods[tuple(parts)] = rel
    return mods


def absolute(mod, p, mods):
    """The crate-absolute form of path `p` written in module `mod`, or None (std, other crates)."""
    if p[0] == "crate":
        return p[1:]
    if p[0] in ("super", "self"):
        base = list(mod)
        while p and p[0] in ("super", "self"):
            base = base[:-1] if p[0] == "super" else base
            p = p[1:]
        return base + p
    if tuple(mod) + (p[0],) in mods:
        return list(mod) + p
    return None


def read_modules(mods):
    """Per module: the paths it names [(line, absolute path)] and its re-exports {name: path}."""
    refs, reexports = {}, {}
    for mod, rel in mods.items():
        code = drop_test_modules(strip(open(os.path.join(ROOT, rel), encoding="utf-8").read()))
        found, exported = [], {}
        for m in re.finditer(r"(\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]+);", code):
            line = code.count("\n", 0, m.start()) + 1
            for p in expand_use(m.group(2)):
                target = absolute(mod, p, mods) if p else None
                if target:
                    found.append((line, target))
                    if m.group(1) and target[-1] != "*":
                        exported[target[-1]] = target
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", code):
            found.append((code.count("\n", 0, m.start()) + 1, absolute(mod, m.group(1).split("::"), mods)))
        for m in re.finditer(r"(?<![\w:])(\w+)::\w", code):
            if tuple(mod) + (m.group(1),) in mods:
                found.append((code.count("\n", 0, m.start()) + 1, list(mod) + [m.group(1)]))
        refs[mod], reexports[mod] = found, exported
    return refs, reexports


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    for v in sorted(set(graph) | {b for bs in graph.values() for b in bs}):
        if v not in index:
            visit(v)
    return sorted(sccs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="also print every edge with where it is")
    args = ap.parse_args()
    sys.setrecursionlimit(10000)

    mods = module_files()
    refs, reexports = read_modules(mods)

    def module_of(path, seen=()):
        """The file module an absolute path names, through re-exports."""
        for k in range(len(path), 0, -1):
            mod = tuple(path[:k])
            if mod in mods:
                name = path[k] if k < len(path) else None
                target = reexports[mod].get(name)
                if target and tuple(target) not in seen:
                    return module_of(target, seen + (tuple(target),))
                return mod
        return None

    failed = False
    for depth in (1, 2):
        edges = defaultdict(list)  # (from, to) -> ["file:line", ...], each place once
        for mod, found in sorted(refs.items()):
            for line, target in found:
                to = module_of(target) if target else None
                if to is None:
                    continue
                a, b = mod[:depth], to[:depth]
                # A file and the module that holds it are one unit: `super::` and `child::` are
                # not edges between modules.
                if a[: len(b)] == b or b[: len(a)] == a:
                    continue
                where = f"{mods[mod]}:{line}"
                if where not in edges[(a, b)]:
                    edges[(a, b)].append(where)
        graph = defaultdict(set)
        for a, b in edges:
            graph[a].add(b)
        name = "::".join
        title = "top-level modules" if depth == 1 else "modules to the second level"
        if args.edges:
            print(f"edges between {title}:")
            for (a, b), where in sorted(edges.items()):
                print(f"  {name(a)} -> {name(b)}  ({', '.join(where[:3])}{', ...' if len(where) > 3 else ''})")
        found = cycles(graph)
        nodes = {m[:depth] for m in mods}
        if not found:
            print(f"no import cycle between the {len(nodes)} {title}")
        for scc in found:
            failed = True
            members = set(scc)
            print(f"cycle among {len(scc)} {title}: {', '.join(map(name, scc))}")
            for a in scc:
                for b in sorted(graph[a] & members):
                    print(f"  {name(a)} -> {name(b)}  ({', '.join(edges[(a, b)][:3])})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
