"""The site daemon's import footprint and its out-of-process data loader.

A site process runs for the whole session, so it imports only what it needs:
no pandas/pyarrow (its file is parsed in a child process, client/dataload.py),
no accounting or plotting libraries.  Checked on ``sys.modules`` of a fresh
interpreter that imports what ``fedsbdt client`` imports — not by timing or RSS.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsbdt.client.dataload import load_isolated
from fedsbdt.common.data import DataError, load
from fedsbdt.common.schema import Schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: top-level packages a site daemon must not hold (measured: pandas + pyarrow ≈ 90 MB, dp_accounting ≈ 90 MB,
#: numba with llvmlite and scipy ≈ 155 MB once a kernel is loaded: the site runs numpy kernels and draws its
#: noise in child processes)
NOT_IN_SITE = {"pandas", "pyarrow", "dp_accounting", "rich", "sklearn", "matplotlib", "xgboost", "opendp", "numba",
               "llvmlite", "scipy"}


def imported_by(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_site_daemon_does_not_import_heavy_modules():
    # what `fedsbdt client` imports before it runs: the CLI with every registered command, then the daemon
    mods = imported_by("import fedsbdt.cli\nfedsbdt.cli.build_parser()\n"
                       "import fedsbdt.client.cli, fedsbdt.client.daemon, fedsbdt.client.site, fedsbdt.client.dataload")
    assert {"fedsbdt", "grpc", "numpy"} <= mods  # the probe imported the daemon
    assert not (mods & NOT_IN_SITE), f"the site daemon imports {sorted(mods & NOT_IN_SITE)}"


def test_the_probe_sees_a_heavy_import():
    assert "pandas" not in imported_by("import fedsbdt.common.data")  # pandas is imported where a file is parsed
    assert "pandas" in imported_by("import fedsbdt.common.estimators")  # which imports it at the top
    assert "numba" not in imported_by("import fedsbdt.common.kernels")  # numba is imported at a kernel's first call
    assert "numba" in imported_by("import fedsbdt.common.kernels, numpy as np\n"
                                  "fedsbdt.common.kernels.apply_leaves(np.zeros(2), np.zeros(2, np.int32), np.ones(1), 1.0)")


def test_a_site_round_and_its_noise_run_without_numba():
    """The site's per-round work (numpy kernels) and exact noise (drawn in a child) never load numba."""
    mods = imported_by(
        "import numpy as np\n"
        "from fedsbdt.common import kernels_numpy as K\n"
        "from fedsbdt.common.randomness import SecureRandomness\n"
        "from fedsbdt.client.isolated_noise import IsolatedSampler\n"
        "r = IsolatedSampler(SecureRandomness())\n"
        "x = r.draw([('gaussian', np.full(4, 3.0)), ('laplace', np.full(2, 2.0))])\n"
        "assert x[0].shape == (4,) and x[1].shape == (2,)\n"
        "leaf = K.leaf_index(np.random.default_rng(0).normal(size=(50, 3)), np.zeros(3, np.int32), np.zeros(3), "
        "np.zeros(3, bool), 2)\n"
        "K.round_sums(leaf, np.zeros(50), np.ones(50), K.BINARY, 2.0**20, 2**20, 2**18, r.subsample(0.5, "
        "np.arange(50), 0), None, 4)\n")
    assert not (mods & {"numba", "llvmlite", "scipy"}), sorted(mods & {"numba", "llvmlite", "scipy"})


@pytest.mark.parametrize("name, file", [("abalone", "abalone.data"), ("adult", "adult.test")])
def test_isolated_load_equals_load(name, file):
    schema = Schema.load(EXAMPLES / name / "schema.toml")
    a = load(EXAMPLES / name / file, schema)
    b = load_isolated(EXAMPLES / name / file, schema)
    assert a.X.dtype == b.X.dtype and a.y.dtype == b.y.dtype and a.ids.dtype == b.ids.dtype
    assert np.array_equal(a.X, b.X, equal_nan=True) and np.array_equal(a.y, b.y) and np.array_equal(a.ids, b.ids)
    assert (a.source, a.dropped, a.arrival, b.schema) == (b.source, b.dropped, b.arrival, schema)


def test_isolated_load_reports_the_same_data_error(tmp_path):
    schema = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    bad = tmp_path / "bad.csv"
    lines = (EXAMPLES / "abalone" / "abalone.data").read_text().splitlines()[:20]
    lines[7] = lines[7].replace("M,", "Q,", 1) if lines[7].startswith("M,") else "Q" + lines[7][1:]
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as direct:
        load(bad, schema)
    with pytest.raises(DataError) as isolated:
        load_isolated(bad, schema)
    assert str(isolated.value) == str(direct.value)
    assert "line 8" in str(isolated.value)
    with pytest.raises(DataError, match="not found"):
        load_isolated(tmp_path / "missing.csv", schema)


def test_isolated_load_runs_this_package_not_one_in_the_working_directory(tmp_path, monkeypatch):
    decoy = tmp_path / "client"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    (decoy / "dataload.py").write_text("import sys\ndef _child(path):\n    sys.exit(7)\n")
    monkeypatch.chdir(tmp_path)
    schema = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    ds = load_isolated(EXAMPLES / "abalone" / "abalone.data", schema)
    assert ds.n == 4177


def test_records_with_missing_values_are_routed_without_numba():
    """A site whose records miss values walks the trees' default directions with the numpy kernels too."""
    mods = imported_by(
        "import numpy as np\n"
        "from fedsbdt.common import kernels_numpy as K\n"
        "from fedsbdt.common.boosting import LocalData\n"
        "from fedsbdt.common.config import Hyperparameters\n"
        "from fedsbdt.common.splits import Splits\n"
        "X = np.array([[0.5, np.nan], [np.nan, 2.0], [1.5, 0.0]])\n"
        "hp = Hyperparameters(epsilon=1.0, trees=1, depth=2)\n"
        "local = LocalData(X, np.zeros(3), np.arange(3), 'binary', hp, None, None, np.zeros(2, bool), backend=K)\n"
        "s = Splits(np.array([0, 1, 1], np.int32), np.array([1.0, 1.0, 1.0]), np.array([True, False, True]))\n"
        "assert local.leaf_index(s).tolist() == [1, 1, 2], local.leaf_index(s)  # NaN right: [1, 3, 2]\n")
    assert "numba" not in mods and "llvmlite" not in mods
