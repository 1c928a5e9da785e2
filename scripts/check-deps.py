#!/usr/bin/env python3
"""Checks the dependency rules of gateway/src (ARCHITECTURE.md, "Dependency
rules"): no import cycle between files, and no forbidden import.

A file's imports are the `crate::` and `super::` paths it names outside its
test code (`#[cfg(test)]` modules and files). A path resolves to the file
of its longest module prefix. Exit status 1 lists each broken rule.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gateway", "src")

# (importer prefix, imported prefix, why): a file whose module path starts
# with the first may not import a module whose path starts with the second.
FORBIDDEN = [
    ("api", "", "api/ is wire types only: it depends on nothing in the gateway"),
    ("translate", "http", "translate/ knows wire types and the worker protocol, not HTTP"),
    ("translate", "routes", "nothing depends on routes"),
    ("store", "translate", "the store keeps events as data; it does not encode them"),
    ("store", "config", "the store takes its own settings, not the config"),
    ("store", "error", "the store returns its own error type"),
    ("limits", "http", "the limiter knows accounts and plans, not HTTP exchanges"),
    ("limits", "error", "the limiter returns its own error type"),
    ("pool", "routes", "nothing depends on routes"),
    ("generation", "routes", "nothing depends on routes"),
    ("generation", "http", "the generation driver does not know HTTP (its HTTP sinks are routes/)"),
    ("generation", "listener", "the listener sits above routes"),
    ("http", "routes", "http/ is the exchange and its reply writer, below routes"),
    ("http", "generation", "http/ is the exchange and its reply writer, below routes"),
    ("http", "listener", "the listener sits above routes"),
    ("http", "app", "http/ is the exchange and its reply writer: no composition root"),
    ("routes", "listener", "the listener sits above routes"),
    ("runs", "routes", "nothing depends on routes"),
    ("accounts", "app", "only server.rs, listener/ and routes/ see the composition root"),
    ("limits", "app", "only server.rs, listener/ and routes/ see the composition root"),
    ("store", "app", "only server.rs, listener/ and routes/ see the composition root"),
    ("runs", "app", "only server.rs, listener/ and routes/ see the composition root"),
    ("usage", "limits", "usage is counted by the limiter, not the other way round"),
    ("config", "accounts", "config is plain data, checked syntactically"),
]
# Imports that break a rule but are accepted for now (each one to remove,
# never to add to). Empty: every rule holds.
KNOWN = set()
# The only importers of `app`.
APP_IMPORTERS = ("server", "listener", "routes", "main", "up")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main") and len(rel) >= 1:
        if rel == ["lib"]:
            return ()
        if rel == ["main"]:
            return ("main",)
        rel = rel[:-1]
    return tuple(rel)


def strip_tests(text):
    """Drops `#[cfg(test)]` items: inline test modules and test-only code."""
    out, skip_depth, pending = [], None, False
    depth = 0
    for line in text.splitlines():
        s = line.strip()
        if skip_depth is None and s.startswith("#[cfg(test)]"):
            pending = True
            continue
        if pending and skip_depth is None:
            pending = False
            if s.endswith(";"):
                continue  # `mod x;` declared test-only
            skip_depth = depth
        opened = line.count("{") - line.count("}")
        depth += opened
        if skip_depth is not None:
            if depth <= skip_depth:
                skip_depth = None
            continue
        out.append(line)
    return "\n".join(out)


def test_only_children(text):
    return set(re.findall(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s+(\w+)\s*;", text))


def main():
    files = {}
    for dirpath, _, names in os.walk(ROOT):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(dirpath, n)
                files[module_of(p)] = p
    texts = {m: open(p).read() for m, p in files.items()}
    test_only = set()
    for m, t in texts.items():
        for child in test_only_children(t):
            test_only.add(m + (child,))
    mods = {m for m in files if m not in test_only}

    def resolve(segments):
        for n in range(len(segments), 0, -1):
            if tuple(segments[:n]) in mods:
                return tuple(segments[:n])
        return None

    path_re = re.compile(r"\b(crate|super)((?:::(?:super|[a-z_][a-z0-9_]*))*)(::\{([^{}]*)\})?")
    edges = {m: set() for m in mods}
    for m in mods:
        text = strip_tests(texts[m])
        for root, rest, _, group in path_re.findall(text):
            # `super` names the parent module: x/ for x/y.rs, and the
            # parent of x/ for x/mod.rs (whose own module is x).
            base = [] if root == "crate" else list(m[:-1])
            segs = [s for s in rest.split("::") if s]
            for s in segs:
                if s == "super":
                    base = base[:-1]
                else:
                    base.append(s)
            targets = [base]
            if group:
                targets = [base + [x.strip() for x in g.split("::") if x.strip()]
                           for g in group.split(",") if g.strip()]
                targets = [[t for t in tg if re.fullmatch(r"[a-z_][a-z0-9_]*", t)] for tg in targets]
            for t in targets:
                r = resolve(t) if t else ()
                if r is None:
                    r = resolve(base) if base else ()
                if r is not None and r != m:
                    edges[m].add(r)

    problems = []
    for m, deps in sorted(edges.items()):
        name = "/".join(m) or "lib"
        for d in sorted(deps):
            dname = "/".join(d) or "lib"
            if (name, dname) in KNOWN:
                continue
            for imp, forbidden, why in FORBIDDEN:
                if name.split("/")[0] != imp:
                    continue
                if forbidden == "":
                    if dname.split("/")[0] != imp:
                        problems.append(f"{name} imports {dname}: {why}")
                elif dname.split("/")[0] == forbidden:
                    problems.append(f"{name} imports {dname}: {why}")
            if dname.split("/")[0] == "app" and name.split("/")[0] not in APP_IMPORTERS + ("app",):
                problems.append(f"{name} imports app: only server.rs, listener/ and routes/ see the composition root")

    # Cycles: strongly connected components of more than one file, leaving
    # out a directory module and its own children (a mod.rs re-exporting).
    def cross(a, b):
        return not (b[: len(a)] == a or a[: len(b)] == b)

    graph = {m: {d for d in ds if cross(m, d)} for m, ds in edges.items()}
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    for comp in sccs:
        names = sorted("/".join(c) or "lib" for c in comp)
        problems.append("import cycle: " + ", ".join(names))
    # dedupe, keep order
    seen = set()
    problems = [p for p in problems if not (p in seen or seen.add(p))]
    if problems:
        print("gateway/src dependency rules broken:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"gateway/src dependency rules hold ({len(mods)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
