"""What a hospital installs is what we test (issue 36): the wheel.

The wheel is built from a copy of the source folders (nothing the checkout's other tests write can reach
it) and must hold every module and data file of them, and nothing else.  Installed non-editable into a
fresh virtual environment and run from a directory outside the checkout, it must import every module,
give the estimators and run ``fedsbdt demo``.  (README's test command installs the package non-editable
too, so the rest of the suite also runs against the installed package, not the checkout.)

The fresh environment sees this environment's packages (``--system-site-packages``) for the
dependencies only: nothing is fetched, and the wheel is installed with ``--no-deps --no-index``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder -> where its files lie in the wheel (setup.py's package map, written out independently)
FOLDERS = {"protos/fedsbdt": "fedsbdt", "common": "fedsbdt/common", "server": "fedsbdt/server",
           "client": "fedsbdt/client", "examples": "fedsbdt/examples"}
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")
_NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc")


def source_files() -> dict[str, Path]:
    """Every file of the source folders, by the path it must have in the wheel."""
    found = {}
    for folder, target in FOLDERS.items():
        for path in (ROOT / folder).rglob("*"):
            parts = path.relative_to(ROOT / folder).parts
            if path.is_file() and "__pycache__" not in parts and path.suffix not in (".pyc", ".nbi", ".nbc"):
                found["/".join((target, *parts))] = path
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel`` of a copy of the sources (the build backend from this environment, no index)."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=_NOT_SOURCE)
    dist = tmp_path_factory.mktemp("dist")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "--wheel-dir", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (built,) = dist.glob("fedsbdt-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """A fresh virtual environment with the wheel installed non-editable; a working directory outside the
    checkout; the environment variables for running in it (no PYTHONPATH)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q",
                        str(wheel)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cwd = tmp_path_factory.mktemp("elsewhere")
    assert ROOT not in cwd.parents
    return venv, env, cwd


def test_the_wheel_holds_every_module_and_data_file_of_the_source_folders_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = {n for n in z.namelist() if ".dist-info/" not in n}
        assert z.read("fedsbdt/examples/abalone/abalone.data") == (ROOT / "examples/abalone/abalone.data").read_bytes()
        entry_points = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    want = source_files()
    assert sorted(set(want) - names) == [], "in the source folders but not in the wheel"
    assert sorted(names - set(want)) == [], "in the wheel but not in the source folders"
    # every package folder (one with __init__.py) is a subpackage of fedsbdt in the wheel
    packages = {n.rsplit("/", 1)[0] for n in want if n.endswith("/__init__.py")}
    assert {"fedsbdt", "fedsbdt/common/modes", "fedsbdt/common/secagg", "fedsbdt/proto/v1"} <= packages
    assert "fedsbdt = fedsbdt.cli:main" in entry_points


def run(installed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    venv, env, cwd = installed
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_installed_wheel_imports_every_module_and_the_estimators_from_outside_the_checkout(installed):
    venv = installed[0]
    code = ("import importlib, pkgutil, fedsbdt\n"
            "names = [m.name for m in pkgutil.walk_packages(fedsbdt.__path__, 'fedsbdt.')]\n"
            "for n in names: importlib.import_module(n)\n"
            "from fedsbdt import SBDTClassifier, SBDTMulticlassClassifier, SBDTRegressor\n"
            "print(fedsbdt.__file__); print(*names)")
    p = run(installed, str(venv / "bin" / "python"), "-c", code)
    assert p.returncode == 0, p.stderr[-3000:]
    where, *names = p.stdout.split()
    assert Path(where).is_relative_to(venv), f"fedsbdt was imported from {where}, not from the installed wheel"
    modules = {n[:-len(".py")].removesuffix("/__init__").replace("/", ".") for n in source_files()
               if n.endswith(".py") and (not n.startswith("fedsbdt/examples/") or n == "fedsbdt/examples/__init__.py")}
    assert set(names) == modules - {"fedsbdt"}  # every module imported (the examples' scripts are data)
    p = run(installed, "fedsbdt", "--version")
    assert p.returncode == 0 and p.stdout.strip().startswith("fedsbdt "), p.stderr


def test_the_installed_wheel_runs_the_demo_from_outside_the_checkout(installed):
    p = run(installed, "fedsbdt", "demo", "--trees", "5", "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)
    assert result["dataset"] == "abalone" and result["trees"] == 5 and result["sites"] == 3
    assert result["rows"] > 3000 and result["epsilon"] > 0
