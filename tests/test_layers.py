"""Layers point down only, checked on the source by AST (issue 38, "layers that point down").

    proto  <  common  <  server, client (beside each other)  <  the top package (fedsbdt.cli, fedsbdt.demo, …)

* ``common/`` imports neither ``server/`` nor ``client/`` nor the top package's modules (only ``fedsbdt`` itself,
  for ``__version__``, and the generated ``fedsbdt.proto``); ``server/`` never imports ``client/`` and ``client/``
  never ``server/``: what both sides need lives in ``common/``, what composes coordinator *and* sites (the
  command line, the demo, the in-process federation, the federated audit) lives at the top.  Imports inside
  functions and ``TYPE_CHECKING`` blocks count, and so does a module named as a string argument of a call
  (``importlib.import_module("fedsbdt.server.cli")``: loading by string is an import too).
* No import circle among fedsbdt's modules, counting imports inside functions.
* An import inside a function is for a heavy optional dependency (:data:`HEAVY`: kept out of the site daemon and
  of ``import fedsbdt``); every other one is a file's debt, listed in :data:`FUNCTION_LEVEL_DEBT`, which may only
  shrink (aim: none).
* Every folder installs under the one package ``fedsbdt``: no file imports a top-level ``common``, ``server`` or
  ``client`` (that would only work from a checkout's root).
"""
from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("common", "server", "client")
#: import name -> folder, as setup.py installs them (the generated stubs under protos/fedsbdt/proto are left out)
FOLDERS = {"fedsbdt": ROOT / "protos" / "fedsbdt", "fedsbdt.common": ROOT / "common", "fedsbdt.server": ROOT / "server",
           "fedsbdt.client": ROOT / "client"}
#: what each layer may import of fedsbdt (a module's own layer included); the top package may import anything
ALLOWED = {
    "common": ("fedsbdt.common", "fedsbdt.proto"),
    "server": ("fedsbdt.server", "fedsbdt.common", "fedsbdt.proto"),
    "client": ("fedsbdt.client", "fedsbdt.common", "fedsbdt.proto"),
}
#: heavy optional dependencies, imported inside the function that needs them so that the site daemon, the
#: command line's start and ``import fedsbdt`` stay light (tests/federation/test_site_imports.py)
HEAVY = {"pandas", "pyarrow", "numba", "llvmlite", "scipy", "sklearn", "xgboost", "matplotlib", "psycopg", "duckdb",
         "opendp", "dp_accounting", "grpc", "prometheus_client", "rich"}
#: imports inside functions that are not of a heavy dependency, per file: debt that may only shrink.  Most
#: are fedsbdt modules imported lazily because they bring a heavy one at their top (the engine: numba;
#: the estimators: pandas, sklearn); the rest are standard-library modules (move them to the file's top).
FUNCTION_LEVEL_DEBT = {  # 300 statements in 52 files when written (issue 38, part "layers")
    "client/cli.py": 17,
    "client/daemon.py": 1,
    "client/dataload.py": 2,
    "client/isolated_noise.py": 1,
    "client/site.py": 4,
    "client/status.py": 1,
    "common/audit.py": 9,
    "common/auto.py": 2,
    "common/builders.py": 1,
    "common/cli.py": 38,
    "common/cli_audit.py": 11,
    "common/cli_base.py": 3,
    "common/cli_explain.py": 4,
    "common/cli_tools.py": 4,
    "common/cli_tune.py": 8,
    "common/data.py": 3,
    "common/engine.py": 3,
    "common/estimators.py": 3,
    "common/estimators_multiclass.py": 1,
    "common/explain.py": 1,
    "common/fed_eval.py": 3,
    "common/federation/keys.py": 2,
    "common/federation/pki.py": 4,
    "common/federation/plan.py": 25,
    "common/federation/release.py": 2,
    "common/federation/tuning.py": 7,
    "common/federation/wire.py": 6,
    "common/ledger_cli.py": 1,
    "common/lifetime.py": 2,
    "common/logging_setup.py": 1,
    "common/model.py": 1,
    "common/modes/base.py": 2,
    "common/modes/dpboost/__init__.py": 2,
    "common/modes/evaluation/__init__.py": 1,
    "common/modes/greedy/__init__.py": 2,
    "common/modes/random/__init__.py": 1,
    "common/modes/releases.py": 4,
    "common/modes/sarus/__init__.py": 2,
    "common/modes/sarus/mechanism.py": 1,
    "common/modes/sarus/rounds.py": 4,
    "common/modes/site_rounds.py": 1,
    "common/multiclass.py": 2,
    "common/randomness.py": 2,
    "common/report.py": 10,
    "common/schema_draft.py": 8,
    "common/testhooks.py": 5,
    "common/tuning.py": 13,
    "protos/fedsbdt/__init__.py": 1,
    "protos/fedsbdt/demo.py": 25,
    "protos/fedsbdt/federated_audit.py": 2,
    "protos/fedsbdt/inprocess.py": 1,
    "server/cli.py": 40,
}


def modules() -> dict[str, Path]:
    """Every production module, by import name."""
    out = {}
    for pkg, base in FOLDERS.items():
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(base).with_suffix("")
            if pkg == "fedsbdt" and rel.parts[0] == "proto":
                continue
            parts = [x for x in rel.parts if x != "__init__"]
            out[".".join([pkg, *parts])] = p
    return out


def layer_of(module: str) -> str:
    """``common``, ``server``, ``client`` or ``top`` (the package fedsbdt's own modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "top"


def _resolve(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _functions_of(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the name of the function it is in (nodes at module level are absent)."""
    inside = {}
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                if n is not f:
                    inside.setdefault(id(n), f.name)
    return inside


def imports(module: str, path: Path, known) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) for every import of a file.  ``from P import x`` names the
    submodule P.x when x is one (``known``), else P; a string argument of a call that is a fedsbdt module's
    name (``importlib.import_module("fedsbdt.x")``) counts as an import of it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    inside = _functions_of(tree)
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, path.name == "__init__.py")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Call):
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value in known]
        out += [(n, node.lineno, id(node) in inside) for n in names]
    return out


def fedsbdt_target(name: str, known) -> str | None:
    """The fedsbdt module an imported name lands in (``fedsbdt.common.x.f`` -> ``fedsbdt.common.x``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for name, _, _ in imports(m, p, mods):
            t = fedsbdt_target(name, mods)
            if t is not None and t != m:
                graph[m].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan): each holds an import circle."""
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

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
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_violations(mods: dict[str, Path]) -> list[str]:
    bad = []
    for m, p in mods.items():
        layer = layer_of(m)
        if layer == "top":
            continue
        for name, line, _ in imports(m, p, mods):
            if name == "fedsbdt" or not name.startswith("fedsbdt."):
                continue  # fedsbdt itself (__version__), or not ours
            if not any(name == a or name.startswith(a + ".") for a in ALLOWED[layer]):
                bad.append(f"{p.relative_to(ROOT)}:{line} ({layer}) imports {name}")
    return bad


def function_level_debt(mods: dict[str, Path]) -> Counter:
    """Per file, the import statements inside functions that are not of a heavy optional dependency."""
    out = Counter()
    for m, p in mods.items():
        lines = {line for name, line, in_function in imports(m, p, mods)
                 if in_function and name.split(".")[0] not in HEAVY}
        if lines:
            out[str(p.relative_to(ROOT))] = len(lines)
    return out


# --------------------------------------------------------------------------- the checks


def test_layers_point_down_only():
    bad = layer_violations(modules())
    assert not bad, "a layer imports one beside or above it:\n" + "\n".join(bad)


def test_no_import_circle():
    found = circles(import_graph(modules()))
    assert not found, f"import circles (imports inside functions counted): {found}"


def test_function_level_imports_are_heavy_or_listed():
    debt = function_level_debt(modules())
    over = {f: (n, FUNCTION_LEVEL_DEBT.get(f, 0)) for f, n in sorted(debt.items()) if n > FUNCTION_LEVEL_DEBT.get(f, 0)}
    assert not over, ("imports inside functions beyond a file's listed debt (found, listed); import at the top "
                      f"of the file, or, for a heavy optional dependency, add it to HEAVY: {over}")


def test_no_file_imports_a_top_level_layer():
    """``import common.x`` works from the checkout's root only (``python -m pytest`` puts it on sys.path)
    and would load a second copy of the module beside ``fedsbdt.common.x``."""
    files = [p for d in (*LAYERS, "tests", "benchmarks", "examples", "protos") for p in (ROOT / d).rglob("*.py")]
    bad = {}
    for p in files:
        found = sorted(n for n, _, _ in imports("x", p, {}) if n.split(".")[0] in LAYERS)
        if found:
            bad[str(p.relative_to(ROOT))] = found
    assert not bad


# --------------------------------------------------------------------------- the checks can fail


def _tree(tmp_path, files: dict[str, str]) -> dict[str, Path]:
    mods = {}
    for name, text in files.items():
        p = tmp_path / (name.replace(".", "_") + ".py")
        p.write_text(text)
        mods[name] = p
    return mods


def test_the_checks_see_imports_inside_functions_strings_and_sideways(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    mods = _tree(tmp_path, {
        "fedsbdt.common.a": "def f():\n    from fedsbdt.server.plan import Plan\n",
        "fedsbdt.common.b": "import importlib\nimportlib.import_module('fedsbdt.client.c')\n",
        "fedsbdt.server.plan": "from fedsbdt.client.c import X\n",
        "fedsbdt.client.c": "import fedsbdt.cli\n",
        "fedsbdt.cli": "import fedsbdt.server.plan, fedsbdt.client.c\n",
    })
    bad = layer_violations(mods)
    assert [b.split(" imports ")[1] for b in bad] == ["fedsbdt.server.plan", "fedsbdt.client.c", "fedsbdt.client.c",
                                                      "fedsbdt.cli"]


def test_the_circle_check_counts_imports_inside_functions(tmp_path):
    mods = _tree(tmp_path, {
        "fedsbdt.common.a": "from fedsbdt.common import b\n",
        "fedsbdt.common.b": "def f():\n    from .a import g\n",
        "fedsbdt.common.c": "from fedsbdt.common.a import x\n",
    })
    assert circles(import_graph(mods)) == [["fedsbdt.common.a", "fedsbdt.common.b"]]


def test_the_debt_check_sees_a_light_import_inside_a_function(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    mods = _tree(tmp_path, {"fedsbdt.common.a": "import json\ndef f():\n    import pandas\n    import hashlib\n"
                                                "    from fedsbdt.common import b\n",
                            "fedsbdt.common.b": ""})
    assert function_level_debt(mods) == Counter({"fedsbdt_common_a.py": 2})
