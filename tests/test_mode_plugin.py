"""A mode from another distribution (docs/plugins.md "Worked example"): tests/data/example-mode is the package
``fedsbdt_greedy_shallow`` with one entry point in the group ``fedsbdt.modes``.  Installed into a fresh
environment that sees the packages of the one running the tests (``--system-site-packages`` where CI installs the
wheel; a virtual environment's site-packages, e.g. an editable install, through a ``.pth`` file), fedsbdt trains
with it, lists it and validates it, though no file of fedsbdt names it."""
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ABALONE, EXAMPLES, ROOT

from fedsbdt.common import modes
from fedsbdt.common.config import ConfigError, Hyperparameters

DIST = ROOT / "tests" / "data" / "example-mode"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """A fresh environment with the example distribution installed (no index, no dependencies fetched)."""
    venv = tmp_path_factory.mktemp("plugin-venv")
    nested = sys.prefix != sys.base_prefix  # run from a virtual environment: the new one sees its packages instead
    subprocess.run([sys.executable, "-m", "venv", *([] if nested else ["--system-site-packages"]), str(venv)],
                   check=True, timeout=120)
    if nested:
        purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path"
                                  "('purelib'))"], capture_output=True, text=True, check=True).stdout.strip()
        lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
        (Path(purelib) / "parent-environment.pth").write_text(lines)
    build = tmp_path_factory.mktemp("plugin-build")
    shutil.copytree(DIST, build / "example-mode")  # setuptools builds in the source tree: a copy, not the checkout
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        str(build / "example-mode")], capture_output=True, text=True, cwd=build, timeout=180)
    assert p.returncode == 0, p.stderr
    env = dict(os.environ)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env, build


def run(plugin_env, *args, ok=True):
    """``args`` in the environment; ``fedsbdt`` is its interpreter's CLI (the script on PATH may be another's)."""
    venv, env, cwd = plugin_env
    if args[0] == "fedsbdt":
        args = (str(venv / "bin" / "python"), "-m", "fedsbdt.cli", *args[1:])
    p = subprocess.run([*args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def test_fedsbdt_trains_with_a_mode_installed_from_another_distribution(plugin_env, tmp_path):
    out = tmp_path / "m.json"
    p = run(plugin_env, "fedsbdt", "train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"),
            "--out", str(out), "--tree-builder", "greedy-shallow", "--epsilon", "1", "--trees", "3", "--depth", "3",
            "--seed", "7", "--settings", "paper", "--quiet")
    model = json.loads(out.read_text())
    assert model["hyperparameters"]["tree_builder"] == "greedy-shallow"
    assert len(model["trees"]) == 3
    # its calibration accounts depth − 1 = 2 levels: the receipt's ε is the target, and less than greedy trees'
    # selection budget per level would give (the same ε spread over 3 levels)
    assert model["privacy"]["epsilon"] == pytest.approx(1.0, rel=1e-5)
    greedy = Hyperparameters(tree_builder="greedy", trees=3, depth=3, subsample=1.0, cyclical=False)
    from fedsbdt.common.engine import calibration_for

    assert model["privacy"]["eps_select"] > calibration_for(greedy).eps_select
    # the help lists it (choices and text come from the registry)
    assert "greedy-shallow" in run(plugin_env, "fedsbdt", "train", "--help").stdout
    assert p.stdout.strip()


def test_the_registry_lists_the_mode_and_validation_accepts_it(plugin_env):
    code = textwrap.dedent("""
        from fedsbdt.common import modes
        from fedsbdt.common.config import ConfigError, Hyperparameters
        from fedsbdt_greedy_shallow import GreedyShallow
        names = sorted(modes.registered())
        assert {"random", "greedy", "dpboost", "sarus", "evaluation", "greedy-shallow"} <= set(names), names
        assert isinstance(modes.tree_builder("greedy-shallow"), GreedyShallow)
        hp = Hyperparameters.from_dict({"tree_builder": "greedy-shallow", "depth": 3})  # with greedy trees' defaults
        assert (hp.tree_builder, hp.subsample) == ("greedy-shallow", 1.0)
        try:
            Hyperparameters.from_dict({"tree_builder": "greedy-shallow", "depth": 1})
        except ConfigError as e:
            assert "depth" in str(e), e
        else:
            raise AssertionError("depth 1 accepted")
        print(",".join(names))
    """)
    venv = plugin_env[0]
    p = run(plugin_env, str(venv / "bin" / "python"), "-c", code)
    assert "greedy-shallow" in p.stdout


def test_the_conformance_suite_covers_the_installed_mode(plugin_env):
    """The suite's mode list is the registry's, so the installed mode is among its parameters, clean and with
    failures (its federated runs wait for the plan to take its federation rules from the mode: docs/plugins.md)."""
    p = run(plugin_env, str(plugin_env[0] / "bin" / "python"), "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider",
            str(ROOT / "tests" / "federation" / "test_conformance.py"))
    assert "test_every_mode_charges_each_record_exactly_what_its_sites_release[greedy-shallow-clean]" in p.stdout
    assert "test_every_mode_charges_each_record_exactly_what_its_sites_release[greedy-shallow-failures]" in p.stdout


def test_an_unknown_tree_builder_is_refused_listing_the_registered_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"no tree builder 'nope' is registered \(registered: dpboost, greedy, "
                                          r"random, sarus"):
        Hyperparameters(tree_builder="nope")
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "train", "--data", str(ABALONE), "--schema",
                        str(EXAMPLES / "abalone/schema.toml"), "--out", str(tmp_path / "m.json"), "--tree-builder",
                        "nope"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr and "random" in p.stderr
    assert not (tmp_path / "m.json").exists()


def test_built_in_modes_are_registered_whichever_mode_registers_first():
    """A mode registered before any look-up (a plug-in imported first) does not hide the built-in ones."""
    code = textwrap.dedent("""
        from fedsbdt.common import modes
        from fedsbdt.common.modes.base import Mode

        class Early(Mode):
            name = "early"
        modes.register(Early())
        assert modes.tree_builder("random").name == "random"
        assert {"random", "greedy", "dpboost", "sarus", "evaluation", "early"} <= set(modes.registered())
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_broken_entry_point_is_named_in_the_error(tmp_path):
    dist = tmp_path / "broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fedsbdt.modes]\nbroken-mode = no_such_module_here:Mode\n")
    code = textwrap.dedent("""
        import sys
        from fedsbdt.common import modes
        try:
            modes.registered()
        except modes.ModeLoadError as e:
            print(e)
            sys.exit(0)
        sys.exit("no error")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert "broken-mode = 'no_such_module_here:Mode'" in p.stdout and "fedsbdt.modes" in p.stdout
    assert modes.ENTRY_POINT_GROUP == "fedsbdt.modes"
