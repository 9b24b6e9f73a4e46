"""Layers point down only: ``common/`` never imports ``server/`` or ``client/``, and ``client/`` never needs
``server/`` (what both sides share lives in ``common/``, e.g. ``common/federation/``)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"common": {"server", "client"}, "client": {"server"}}


def imported_packages(path: Path) -> set[str]:
    """Top-level packages a module imports anywhere (module level, functions, TYPE_CHECKING blocks)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_point_down_only(layer):
    bad = {str(p.relative_to(ROOT)): sorted(imported_packages(p) & FORBIDDEN[layer])
           for p in sorted((ROOT / layer).rglob("*.py"))}
    assert not {k: v for k, v in bad.items() if v}, f"{layer}/ imports a higher layer"


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from server.plan import Plan\n    import client.site\n")
    assert imported_packages(mod) == {"server", "client"}
