"""The architecture's numbers (issue "a mode is one package"): what a reviewer counts by hand, counted by AST (the
import graph is tests/test_layers.py's).

* **mode names outside the modes package** — a tree builder's name (``random``, ``greedy``, ``dpboost``,
  ``sarus``) in quotes, in code or a docstring, in production code (``common/``, ``server/``, ``client/``, the
  top package) outside ``common/modes/``;
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
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
# the module graph tests/test_layers.py enforces (imports inside functions, TYPE_CHECKING blocks and modules
# named as strings counted), so the numbers here are the guard's
from test_layers import circles, import_graph, modules  # noqa: E402

#: a tree builder's name quoted in source (code or docstring), as a reviewer greps for it
MODE_NAME = re.compile(r"[\"'](random|greedy|dpboost|sarus)[\"']")
LONG = 80


def mode_names(mods: dict[str, Path]) -> dict[str, int]:
    counts = {}
    for m, p in mods.items():
        if m.startswith("fedsbdt.common.modes"):
            continue
        n = len(MODE_NAME.findall(p.read_text()))
        if n:
            counts[str(p.relative_to(ROOT))] = n
    return counts


def long_functions(mods: dict[str, Path]) -> list[tuple[str, int]]:
    out = []
    for p in mods.values():
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
