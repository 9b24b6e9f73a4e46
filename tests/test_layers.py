"""Layers point down only: ``common/`` never imports ``server/`` or ``client/``, and ``client/`` never needs
``server/`` (what both sides share lives in ``common/``, e.g. ``common/federation/``).  Every folder installs
under the one package ``fedsbdt`` (``fedsbdt.common``, ``fedsbdt.server``, ``fedsbdt.client``): no file imports
a top-level ``common``, ``server`` or ``client`` (that would only work from a checkout's root)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("common", "server", "client")
FORBIDDEN = {"common": {"server", "client"}, "client": {"server"}}


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports anywhere (module level, functions, TYPE_CHECKING blocks)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def imported_layers(path: Path) -> set[str]:
    """The layers (``common``, ``server``, ``client``) of ``fedsbdt`` that a file imports."""
    return {m.split(".")[1] for m in imported_modules(path)
            if m.startswith("fedsbdt.") and m.split(".")[1] in LAYERS}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_point_down_only(layer):
    bad = {str(p.relative_to(ROOT)): sorted(imported_layers(p) & FORBIDDEN[layer])
           for p in sorted((ROOT / layer).rglob("*.py"))}
    assert not {k: v for k, v in bad.items() if v}, f"{layer}/ imports a higher layer"


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from fedsbdt.server.plan import Plan\n    import fedsbdt.client.site\n")
    assert imported_layers(mod) == {"server", "client"}


def test_no_file_imports_a_top_level_layer():
    """``import common.x`` works from the checkout's root only (``python -m pytest`` puts it on sys.path)
    and would load a second copy of the module beside ``fedsbdt.common.x``."""
    files = [p for d in (*LAYERS, "tests", "benchmarks", "examples", "protos") for p in (ROOT / d).rglob("*.py")]
    bad = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.split(".")[0] in LAYERS)
           for p in files}
    assert not {k: v for k, v in bad.items() if v}
