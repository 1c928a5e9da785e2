#!/usr/bin/env python3
"""Checks the dependency rules of gateway/src, planner/src and worker/src
(ARCHITECTURE.md, "Dependency rules"): no import cycle between modules nor
between files, and no forbidden import.

A file's imports are the `crate::` and `super::` paths its code names
outside tests (`#[cfg(test)]` modules and files) and comments, groups
(`crate::{a, b::{c, d}}`) expanded; in the worker, whose `main.rs` is a
binary over its library, `worker::` paths too. A module is a top-level
folder or a top-level file of the crate's src (`limits/`, `config.rs`);
module A imports module B when any file of A names a path into B. Exit
status 1 lists each broken rule with the file:line that breaks it.
"""
import os
import re
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROUTES_RULE = "nothing depends on routes"
APP_RULE = "only server.rs, listener/ and routes/ see the composition root"
# (importer module, imported module, why): module A may not import module
# B. An empty imported module means "any other module".
GATEWAY_FORBIDDEN = [
    ("api", "", "api/ is wire types only: it depends on nothing in the gateway"),
    ("ids", "", "ids.rs makes public ids for every layer, so it imports none"),
    ("translate", "http", "translate/ knows wire types and the worker protocol, not HTTP"),
    ("translate", "routes", ROUTES_RULE),
    ("store", "translate", "the store keeps events as data; it does not encode them"),
    ("store", "config", "the store takes its own settings, not the config"),
    ("store", "error", "the store returns its own error type"),
    ("limits", "http", "the limiter knows accounts and plans, not HTTP exchanges"),
    ("limits", "error", "the limiter returns its own error type"),
    ("accounts", "error", "accounts return their own error type"),
    ("pool", "error", "the pool returns its own error type"),
    ("pool", "routes", ROUTES_RULE),
    ("generation", "routes", ROUTES_RULE),
    ("generation", "http", "the generation driver does not know HTTP (its HTTP sinks are routes/)"),
    ("generation", "listener", "the listener sits above routes"),
    ("http", "routes", "http/ is the exchange and its reply writer, below routes"),
    ("http", "generation", "http/ is the exchange and its reply writer, below routes"),
    ("http", "listener", "the listener sits above routes"),
    ("http", "app", "http/ is the exchange and its reply writer: no composition root"),
    ("routes", "listener", "the listener sits above routes"),
    ("runs", "routes", ROUTES_RULE),
    ("runs", "responses", "runs/ sits below the Responses path: the adopter of a handed-over "
     "run, which enters that path, is responses/adopt.rs"),
    ("responses", "routes", ROUTES_RULE),
    ("responses", "http", "responses/ is the Responses path whatever the transport: the routes "
     "keep the transport (HTTP, WebSocket)"),
    ("responses", "listener", "the listener sits above routes"),
    ("planner_mode", "routes", ROUTES_RULE),
    ("generation", "planner_mode", "the planner drives generation, never the other way round"),
    ("validate", "planner_mode", "the planner checks its own tool ids and agents (planner::begin)"),
    ("redis", "store", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "limits", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "accounts", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "runs", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "planner_mode", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "usage", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "routes", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "generation", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "config", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("redis", "idempotency", "redis/ is the transport below every domain: it knows no domain's keys"),
    ("idempotency", "error", "the idempotency records return their own error type"),
    ("idempotency", "http", "the idempotency records know no HTTP: routes/ reads the header"),
    ("idempotency", "config", "the idempotency records take their own settings, not the config"),
    ("usage", "limits", "usage is counted by the limiter, not the other way round"),
    ("config", "accounts", "config is plain data, checked syntactically"),
    ("config", "pool", "config is plain data: the pool reads it, not the other way round"),
    ("config", "planner_mode", "config is plain data: the planner reads it, not the other way round"),
]
# Modules only the listed modules may import (besides themselves).
GATEWAY_ONLY_IMPORTED_BY = {
    "app": (("server", "listener", "routes", "main", "up"), APP_RULE),
    "planner_mode": (("routes", "app", "operator"),
                     "planner_mode/ (the planner's ports) sits below routes/: only routes/ and "
                     "app.rs drive it, and `gateway agents` (operator/) edits its directory store"),
}
# Modules that may import only the listed ones (besides themselves).
GATEWAY_ONLY_IMPORTS = {
    "error": (("store", "limits", "accounts", "pool", "idempotency"),
              "error/ is the envelope, the status table and the map of the lower layers' "
              "errors (map.rs): every layer above them may use it, so it imports only them"),
}
# Modules one-way inside: the directory module (its mod.rs, a dispatcher)
# may import its files, but none of them imports it back; the handlers
# listed import no other handler, and the other files (helpers) none.
ONE_WAY_INSIDE = {
    "routes": (
        ("chat", "compact", "messages", "models", "openapi", "planner", "responses",
         "responses_ws"),
        "routes/ is one-way inside: mod.rs dispatches to the handlers, which share only "
        "helpers (steps.rs, idempotent.rs, sinks.rs, follow.rs, ...) and never borrow "
        "another handler's request path",
    ),
}

# Module imports that break a rule or close a cycle but are accepted for
# now: each one to remove, never to add to. An entry that no longer
# occurs, or no longer closes a cycle, is reported so it gets removed.
GATEWAY_KNOWN = set()

# The worker's layers, one way: main.rs (the binary) → service → engine/ →
# pipeline/ → seam/. The service sees an engine only through its seam
# (`service::Engines`), so only main.rs, which loads the engine, names
# engine/. Modules that may import only the listed ones (besides
# themselves): the allowed directions, from the imports as they are.
WORKER_ONLY_IMPORTS = {
    "seam": ((), "seam/ is what every layer shares: it imports nothing of the worker"),
    "status": ((), "status.rs is the one place statuses get their reason: it imports nothing"),
    "pipeline": (("seam", "status"), "pipeline/ sits below the engines: it knows the seams only"),
    "engine": (("pipeline", "seam", "status", "model", "sampling_defaults"),
               "engine/ sits below the service: the pipeline, the seams, the model's profile "
               "and sampling, never the service, admission, drain or the binary"),
    "weights": ((), "weights/ is `worker fetch-weights`: it imports nothing of the serving path"),
}
WORKER_ONLY_IMPORTED_BY = {
    "service": (("main", "metrics"), "the service is the top of the library: only main.rs "
                "serves it and metrics.rs reads its state"),
    "engine": (("main",), "only main.rs loads an engine; the service sees it through its seam"),
    "weights": (("main",), "weights/ is `worker fetch-weights`, run by main.rs only"),
}

# The planner crate's rooms, one way: run/ → agents/ → a2a/ → net/, with
# ports.rs (what the host implements), metrics.rs, text.rs and ids.rs below
# everything.
PLANNER_ONLY_IMPORTS = {
    "ports": ((), "ports.rs is what the host implements: it imports nothing of the planner"),
    "metrics": ((), "metrics.rs holds the planner's series: it imports nothing"),
    "text": ((), "text.rs quotes and clips untrusted text for every room: it imports nothing"),
    "ids": ((), "ids.rs mints the planner's random ids for every room: it imports nothing"),
    "net": ((), "net/ is the agents' HTTP (address policy, client, SSE): it knows no A2A, "
            "directory or run"),
    "a2a": (("net", "text", "ids"), "a2a/ speaks A2A over net/: it knows no directory or run"),
    "agents": (("a2a", "net", "ports", "text"), "agents/ is the directory (entries, cards, "
               "discovery): it knows no run"),
    "config": (("agents",), "config.rs is the planner's settings and their rules; an entry's "
               "rules are agents/'"),
}

CRATES = [
    {
        "name": "gateway/src",
        "root": os.path.join(REPO, "gateway", "src"),
        "aliases": (),
        "forbidden": GATEWAY_FORBIDDEN,
        "only_imports": GATEWAY_ONLY_IMPORTS,
        "only_imported_by": GATEWAY_ONLY_IMPORTED_BY,
        "known": GATEWAY_KNOWN,
        "one_way_inside": ONE_WAY_INSIDE,
    },
    {
        "name": "planner/src",
        "root": os.path.join(REPO, "planner", "src"),
        "aliases": (),
        "forbidden": [],
        "only_imports": PLANNER_ONLY_IMPORTS,
        "only_imported_by": {},
        "known": set(),
    },
    {
        "name": "worker/src",
        "root": os.path.join(REPO, "worker", "src"),
        "aliases": ("worker",),
        "forbidden": [],
        "only_imports": WORKER_ONLY_IMPORTS,
        "only_imported_by": WORKER_ONLY_IMPORTED_BY,
        "known": set(),
    },
]


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main") and len(rel) >= 1:
        if rel == ["lib"]:
            return ()
        if rel == ["main"]:
            return ("main",)
        rel = rel[:-1]
    return tuple(rel)


def strip_tests(text):
    """Blanks `#[cfg(test)]` items (inline test modules and test-only code)
    and `//` comments, keeping line numbers."""
    out, skip_depth, pending = [], None, False
    depth = 0
    for line in text.splitlines():
        s = line.strip()
        if skip_depth is None and s.startswith("#[cfg(test)]"):
            pending = True
            out.append("")
            continue
        if pending and skip_depth is None:
            pending = False
            if s.endswith(";"):
                out.append("")
                continue  # `mod x;` declared test-only
            skip_depth = depth
        opened = line.count("{") - line.count("}")
        depth += opened
        if skip_depth is not None:
            if depth <= skip_depth:
                skip_depth = None
            out.append("")
            continue
        out.append("" if s.startswith("//") else line)
    return "\n".join(out)


def test_only_children(text):
    return set(re.findall(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s+(\w+)\s*;", text))


def test_only_paths(text):
    """The files of test-only modules declared with `#[path = "..."]`."""
    return set(re.findall(
        r"#\[cfg\(test\)\]\s*#\[path\s*=\s*\"([^\"]+)\"\]\s*(?:pub\s+)?mod\s+\w+\s*;", text))


IDENT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\*)")


def use_tree(text, i):
    """Parses the path tree after `crate::`/`super::` at `i`: the list of
    paths it names (lists of segments; `self` in a group names its prefix)."""
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        paths, j = [], j + 1
        while True:
            while j < len(text) and (text[j].isspace() or text[j] == ","):
                j += 1
            if j >= len(text) or text[j] == "}":
                return paths, j + 1
            sub, j = use_tree(text, j)
            paths.extend(sub)
    m = IDENT.match(text, j)
    if not m:
        return [[]], j
    name, j = m.group(1), m.end()
    if text.startswith("::", j):
        sub, j = use_tree(text, j + 2)
        head = [] if name == "self" else [name]
        return [head + p for p in sub], j
    alias = re.compile(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*").match(text, j)
    if alias:
        j = alias.end()
    if name in ("self", "*"):
        return [[]], j
    return [[name]], j


def imports(module, text, aliases=()):
    """(line, path) for every `crate::`/`super::` path of `text` (and
    every path under one of `aliases`, names of the crate itself), the path
    from the crate root."""
    found = []
    roots = "|".join(("crate", "super") + tuple(aliases))
    for m in re.finditer(r"\b(" + roots + r")::", text):
        if m.start() > 0 and text[m.start() - 1] == ":":
            continue  # the tail of `super::super::` or `a::super::`
        base = list(module[:-1]) if m.group(1) == "super" else []
        line = text.count("\n", 0, m.start()) + 1
        paths, _ = use_tree(text, m.end())
        for p in paths:
            full = list(base)
            for seg in p:
                if seg == "super":
                    full = full[:-1]
                else:
                    full.append(seg)
            found.append((line, full))
    return found


def rel(path):
    return os.path.relpath(path, REPO)


def first_cycle(graph, nodes):
    """A shortest cycle through the first of `nodes` inside `nodes`."""
    start = min(nodes)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in nodes:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return [start] + list(reversed(path[:-1])) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def strongly_connected(graph):
    """Tarjan's components of more than one node."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                sccs.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sccs


def reaches(graph, a, b):
    seen, todo = {a}, [a]
    while todo:
        v = todo.pop()
        if v == b:
            return True
        for w in graph.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return False


def check(krate):
    """The broken rules of one crate, and a summary line when none is."""
    FORBIDDEN, KNOWN = krate["forbidden"], krate["known"]
    ONLY_IMPORTED_BY, ONLY_IMPORTS = krate["only_imported_by"], krate["only_imports"]
    files = {}
    for dirpath, _, names in os.walk(krate["root"]):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(dirpath, n)
                files[module_of(krate["root"], p)] = p
    texts = {m: open(p).read() for m, p in files.items()}
    test_only = set()
    for m, t in texts.items():
        for child in test_only_children(t):
            test_only.add(m + (child,))
        for path in test_only_paths(t):
            test_only.add(module_of(krate["root"], os.path.join(os.path.dirname(files[m]), path)))
    mods = {m for m in files if not any(m[:n] in test_only for n in range(1, len(m) + 1))}

    def resolve(segments):
        for n in range(len(segments), 0, -1):
            if tuple(segments[:n]) in mods:
                return tuple(segments[:n])
        return None

    # File edges and module edges, each with the sites that make it.
    edges = {m: set() for m in mods}
    module_sites = {}
    for m in mods:
        for line, path in imports(m, strip_tests(texts[m]), krate["aliases"]):
            r = resolve(path) if path else ()
            if r is None:
                continue
            if r != m:
                edges[m].add(r)
            if m and r and m[0] != r[0]:
                module_sites.setdefault((m[0], r[0]), []).append(f"{rel(files[m])}:{line}")
    for sites in module_sites.values():
        sites.sort(key=lambda s: (s.split(":")[0], int(s.split(":")[1])))

    def where(edge):
        sites = module_sites[edge]
        more = f" (and {len(sites) - 1} more)" if len(sites) > 1 else ""
        return sites[0] + more

    problems = []
    for (a, b) in sorted(module_sites):
        if (a, b) in KNOWN:
            continue
        for imp, forbidden, why in FORBIDDEN:
            if a == imp and (forbidden == "" or b == forbidden):
                problems.append(f"{a} imports {b} ({where((a, b))}): {why}")
        if b in ONLY_IMPORTED_BY:
            allowed, why = ONLY_IMPORTED_BY[b]
            if a not in allowed:
                problems.append(f"{a} imports {b} ({where((a, b))}): {why}")
        if a in ONLY_IMPORTS:
            allowed, why = ONLY_IMPORTS[a]
            if b not in allowed:
                problems.append(f"{a} imports {b} ({where((a, b))}): {why}")

    # Module cycles, known debts left out.
    modules = {a for a, _ in module_sites} | {b for _, b in module_sites}
    graph = {v: set() for v in modules}
    for (a, b) in module_sites:
        if (a, b) not in KNOWN:
            graph[a].add(b)
    for comp in sorted(strongly_connected(graph), key=min):
        cycle = first_cycle(graph, comp)
        problems.append("module cycle: " + " -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            problems.append(f"    {a} -> {b}: {where((a, b))}")
        shown = set(zip(cycle, cycle[1:]))
        others = sorted((a, b) for a in comp for b in graph[a] if b in comp and (a, b) not in shown)
        if others:
            problems.append("    other edges among " + ", ".join(sorted(comp)) + ":")
            for a, b in others:
                problems.append(f"      {a} -> {b}: {where((a, b))}")
    for (a, b) in sorted(KNOWN):
        if (a, b) not in module_sites:
            problems.append(f"KNOWN lists {a} -> {b}, which no file imports any more: remove it")
        elif not reaches(graph, b, a) and not any(
            a == imp and (f == "" or b == f) for imp, f, _ in FORBIDDEN
        ) and not (a in ONLY_IMPORTS and b not in ONLY_IMPORTS[a][0]) and not (
            b in ONLY_IMPORTED_BY and a not in ONLY_IMPORTED_BY[b][0]
        ):
            problems.append(f"KNOWN lists {a} -> {b}, which closes no cycle and breaks no rule any more: remove it")

    # Modules one-way inside.
    for top, (handlers, why) in krate.get("one_way_inside", {}).items():
        for m in sorted(mods):
            if len(m) < 2 or m[0] != top:
                continue
            own = m[1] if m[1] in handlers else None
            for line, path in imports(m, strip_tests(texts[m]), krate["aliases"]):
                r = resolve(path) if path else None
                if r is None or r[:1] != (top,):
                    continue
                if r == (top,):
                    what = f"{top}/mod.rs"
                elif r[1] in handlers and r[1] != own:
                    what = f"the handler {top}/{r[1]}"
                else:
                    continue
                problems.append(f"{rel(files[m])}:{line} imports {what}: {why}")

    # File cycles: strongly connected components of more than one file,
    # leaving out a directory module and its own children (a mod.rs
    # re-exporting).
    def cross(a, b):
        return not (b[: len(a)] == a or a[: len(b)] == b)

    file_graph = {
        m: {d for d in ds if cross(m, d) and (m[:1], d[:1]) not in KNOWN}
        for m, ds in edges.items()
    }
    for comp in strongly_connected(file_graph):
        names = sorted("/".join(c) or "lib" for c in comp)
        problems.append("file import cycle: " + ", ".join(names))
    # dedupe, keep order
    seen = set()
    problems = [p for p in problems if not (p in seen or seen.add(p))]
    summary = (
        f"{krate['name']} dependency rules hold ({len(mods)} files, {len(modules)} modules, "
        f"{len(KNOWN)} known debt{'s' if len(KNOWN) != 1 else ''})"
    )
    return problems, summary


def main():
    status = 0
    for krate in CRATES:
        problems, summary = check(krate)
        if problems:
            print(f"{krate['name']} dependency rules broken:", file=sys.stderr)
            for p in problems:
                print("  " + p, file=sys.stderr)
            status = 1
        else:
            print(summary)
    return status


if __name__ == "__main__":
    sys.exit(main())
