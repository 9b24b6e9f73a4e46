"""A site with ``--plan FILE`` checks everything it can before it connects (docs/deployment.md): the plan's σ
against its hyperparameters, the site's policy, its keys and its data against the schema.  No coordinator
runs here: each refusal must come at once (exit 2, one line, no retry, no ledger), not after 300 s of
retrying an address nobody serves."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fedsbdt.common.config import Hyperparameters

from .conftest import ROOT, SITES, abalone_with_ids, make_identities, make_test_plan, write_splits
from .processes import free_port


@pytest.fixture
def site_files(tmp_path):
    schema, raw = abalone_with_ids(60)
    ids = make_identities(tmp_path, SITES)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=3, epsilon=1.0))
    plan.save(tmp_path / "plan.toml")
    return plan, write_splits(raw, SITES, tmp_path / "data")


def _client(tmp_path, plan_path, data, *extra):
    cmd = [sys.executable, "-m", "fedsbdt.cli", "client", "--coordinator", f"127.0.0.1:{free_port()}",
           "--site", "hospital-1", "--data", str(data), "--state", str(tmp_path / "hospital-1"), "--insecure",
           "--plan", str(plan_path), *extra]  # default --reconnect-timeout: 300 s
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("case", ["sigma", "max-epsilon", "data"])
def test_a_refusal_known_locally_comes_before_any_connection_attempt(tmp_path, site_files, case):
    plan, data = site_files
    plan_path, extra, expected = tmp_path / "plan.toml", [], ""
    if case == "sigma":  # a plan whose stated σ does not match its hyperparameters
        text = plan.to_toml().replace(f"sigma = {plan.stated_sigma!r}", f"sigma = {plan.stated_sigma / 2!r}")
        plan_path = tmp_path / "halved.toml"
        plan_path.write_text(text)
        expected = "states σ"
    elif case == "max-epsilon":
        extra, expected = ["--max-epsilon", "0.5"], "exceeds this site's limit --max-epsilon 0.5"
    else:  # the site's file breaks the schema (a text in a numeric column)
        bad = tmp_path / "bad.csv"
        lines = data["hospital-1"].read_text().splitlines()
        cells = lines[2].split(",")
        cells[3] = "not-a-number"
        bad.write_text("\n".join([*lines[:2], ",".join(cells), *lines[3:]]) + "\n")
        data = {"hospital-1": bad}
        expected = "does not match the plan's schema"
    p, secs = _client(tmp_path, plan_path, data["hospital-1"], *extra)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], p.stderr[-2000:]
    assert "retrying" not in p.stderr and "Traceback" not in p.stderr
    assert secs < 60  # not the 300 s of --reconnect-timeout (it is ~2 s; generous for a loaded machine)
    assert not list((tmp_path / "hospital-1").glob("*.sqlite*"))  # no ledger
