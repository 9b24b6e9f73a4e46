"""The architecture's numbers (issue "a mode is one package"): what a reviewer counts by hand, counted by AST.

* **mode names outside the modes package** — string literals equal to a registered mode's name (a tree
  builder: ``random``, ``greedy``, ``dpboost``, ``sarus``) in production code (``common/``, ``server/``,
  ``client/``) outside ``common/modes/``;
* **import circles** — strongly connected components of the ``fedsbdt`` module graph, counting every import,
  including those inside functions;
* **long functions** — production functions over 80 lines;
* **server → client imports**.

    python benchmarks/architecture.py [--json out.json]
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"common": "fedsbdt.common", "server": "fedsbdt.server", "client": "fedsbdt.client",
           "protos/fedsbdt": "fedsbdt"}
MODE_NAMES = ("random", "greedy", "dpboost", "sarus")
LONG = 80


def modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        base = ROOT / folder
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(base).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            name = ".".join([pkg, *parts]) if parts else pkg
            out[name] = p
    return out


def _resolve(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), str(p))
        is_pkg = p.name == "__init__.py"
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # ``from P import x``: the submodule P.x if x is one, else the module P (a name defined there).
                # Importing a submodule runs its package's __init__ first, for every import of it alike; that
                # implicit parent edge is counted for none (``from . import shamir`` was counted as an import
                # of the package while ``from .shamir import f`` was not)
                base = _resolve(m, node, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t.startswith("fedsbdt"):
                    graph[m].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of size > 1 (each is at least one import circle)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def mode_names(mods: dict[str, Path]) -> dict[str, int]:
    counts = {}
    for m, p in mods.items():
        if m.startswith("fedsbdt.common.modes") or m.startswith("fedsbdt.proto"):
            continue
        n = sum(1 for node in ast.walk(ast.parse(p.read_text()))
                if isinstance(node, ast.Constant) and node.value in MODE_NAMES)
        if n:
            counts[str(p.relative_to(ROOT))] = n
    return counts


def long_functions(mods: dict[str, Path]) -> list[tuple[str, int]]:
    out = []
    for m, p in mods.items():
        if m.startswith("fedsbdt.proto"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG:
                    out.append((f"{p.relative_to(ROOT)}:{node.lineno} {node.name}", n))
    return sorted(out, key=lambda x: -x[1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    mods = modules()
    graph = import_graph(mods)
    names = mode_names(mods)
    circ = circles(graph)
    longf = long_functions(mods)
    sideways = sorted(f"{m} -> {t}" for m, ts in graph.items() if m.startswith("fedsbdt.server")
                      for t in ts if t.startswith("fedsbdt.client"))
    up = sorted(f"{m} -> {t}" for m, ts in graph.items() if m.startswith("fedsbdt.common")
                for t in ts if t.startswith(("fedsbdt.client", "fedsbdt.server")))
    res = {"mode_names_outside_modes": sum(names.values()), "mode_names_by_file": names,
           "import_circles": len(circ), "circles": circ, "functions_over_80_lines": len(longf),
           "long_functions": longf, "server_imports_client": sideways, "common_imports_up": up,
           "modules": len(mods)}
    print(f"mode names outside common/modes: {res['mode_names_outside_modes']}  {names}")
    print(f"import circles (function-level imports counted): {len(circ)}")
    for c in circ:
        print("   ", len(c), ", ".join(x.removeprefix("fedsbdt.") for x in c)[:300])
    print(f"production functions over {LONG} lines: {len(longf)}")
    for f, n in longf:
        print(f"    {n:4d} {f}")
    print(f"server -> client imports: {len(sideways)}", *sideways, sep="\n    ")
    print(f"common -> client/server imports: {len(up)}", *up, sep="\n    ")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
