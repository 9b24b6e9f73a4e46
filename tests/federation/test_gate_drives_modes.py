"""The gate drives the mode (issue 38): a mode's site code only checks, declares and computes; the gate alone
orders attempt → admit → compute → noise → charge → send, and the noise rule exists once per side
(client/noise.py ``draw_share`` at a site, common/modes/coordinator.py ``central_noise`` at the coordinator)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from fedsbdt.client.gate import ModeStoreView
from fedsbdt.client.noise import draw_share
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import SiteEntry, make_plan
from fedsbdt.common.modes.coordinator import central_noise
from fedsbdt.common.modes.site_rounds import SiteContext

from .conftest import abalone_with_ids

ROOT = Path(__file__).resolve().parents[2]


def test_mode_site_code_never_reaches_the_gate_the_noise_or_secure_aggregation():
    """No mode's site rounds (nor their framework) name the gate, the site's ledger or secure aggregation, nor
    draw noise: what they may read is the SiteContext, what they return is a declaration and a vector."""
    forbidden = re.compile(r"\b(gate|ledger|masked_input|settled_input|secagg|discrete_gaussian|discrete_laplace|"
                           r"noise_divisor|NoiseShares)\b|\.take\(")
    files = [ROOT / "common" / "modes" / "site_rounds.py", *sorted((ROOT / "common" / "modes").glob("*/site.py"))]
    assert len(files) >= 5
    found = {}
    for path in files:
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        code = re.sub(r'"""(.|\n)*?"""', "", code)  # docstrings may say what the gate does
        hits = sorted({m.group(0) for m in forbidden.finditer(code)})
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found


def test_the_site_context_is_all_a_mode_may_read():
    names = {f.name for f in dataclasses.fields(SiteContext)}
    assert names == {"plan", "local", "randomness", "table", "store", "abort"}
    ctx = SiteContext(None, None, None, None, None, RuntimeError)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.plan = object()
    public = {n for n in dir(ModeStoreView) if not n.startswith("_")}
    assert public == {"mode_state", "set_mode_state", "keep_mode_state", "released_splits", "remember_splits"}


# --------------------------------------------------------------------------- the noise rule, once per side


class Recording:
    """A randomness stand-in that records which sampler was asked for which scales (returns zeros)."""

    def __init__(self):
        self.calls = []

    def discrete_gaussian(self, scales):
        self.calls.append(("gaussian", np.asarray(scales, np.float64).copy()))
        return np.zeros(np.size(scales), np.int64)

    def discrete_laplace(self, scales):
        self.calls.append(("laplace", np.asarray(scales, np.float64).copy()))
        return np.zeros(np.size(scales), np.int64)


class Ahead:
    def __init__(self):
        self.keys = []

    def take(self, key=None):
        self.keys.append(key)
        return np.full(3, 7, np.int64)


@pytest.fixture(scope="module")
def plans():
    schema, _ = abalone_with_ids(60)
    hp = Hyperparameters(epsilon=1.0, trees=3, depth=2, init_share=0.1, seed=5)
    sites = [SiteEntry(s, bytes([i + 1]) * 32) for i, s in enumerate(["a", "b", "c", "d"])]
    out = {noise: make_plan(schema, hp, sites, threshold=3, randomness="insecure-test", noise=noise,
                            eval_epsilon=0.5) for noise in ("distributed", "central")}
    return out


def _draw(plan, kind, **kw):
    rnd = Recording()
    share = draw_share(plan, plan.releases[kind], rnd, **kw)
    return share, rnd.calls


def test_a_site_draws_a_split_share_at_the_divisor_of_its_round(plans):
    plan = plans["distributed"]
    tree = plan.releases["tree"]
    for p in (3, 4):
        share, calls = _draw(plan, "tree", participants=p, retry=False)
        assert [c[0] for c in calls] == ["gaussian"]
        assert np.array_equal(calls[0][1], tree.scales(plan.noise_divisor(p)))
    _, calls = _draw(plan, "tree", participants=4, retry=True)  # a retry too: every input is noised
    assert np.array_equal(calls[0][1], tree.scales(plan.noise_divisor(4)))
    for p in (2, 5):  # impossible participant sets: secure aggregation refuses the round; nothing is drawn
        assert _draw(plan, "tree", participants=p, retry=False) == (None, [])
    ahead = Ahead()
    got = draw_share(plan, tree, Recording(), participants=4, retry=False, ahead=ahead)
    assert ahead.keys == [plan.noise_divisor(4)] and got.tolist() == [7, 7, 7]


def test_central_noise_a_site_adds_a_full_share_to_retries_only(plans):
    plan = plans["central"]
    assert _draw(plan, "tree", participants=4, retry=False) == (None, [])
    _, calls = _draw(plan, "tree", participants=4, retry=True)
    assert calls[0][0] == "gaussian" and np.array_equal(calls[0][1], plan.releases["tree"].scales(1))
    assert _draw(plan, "init", participants=None, retry=False) == (None, [])
    _, calls = _draw(plan, "init", participants=None, retry=True)
    assert calls[0][0] == "laplace" and np.array_equal(calls[0][1], plan.releases["init"].scales())
    _, calls = _draw(plan, "eval", participants=None, retry=False)  # every site noises its evaluation in full
    assert calls[0][0] == "gaussian" and np.array_equal(calls[0][1], plan.releases["eval"].scales())


def test_full_noise_shares_and_a_share_drawn_ahead(plans):
    plan = plans["distributed"]
    _, calls = _draw(plan, "init", participants=None, retry=False)
    assert calls[0][0] == "laplace" and np.array_equal(calls[0][1], plan.releases["init"].scales())
    drawn = np.arange(2, dtype=np.int64)
    rnd = Recording()
    assert draw_share(plan, plan.releases["init"], rnd, participants=None, retry=False, ahead=drawn) is drawn
    assert rnd.calls == []


def test_the_coordinator_adds_the_full_noise_in_central_mode_only(plans):
    rnd = Recording()
    for kind in ("tree", "init", "eval"):
        assert central_noise(plans["distributed"], kind, rnd) is None
    assert rnd.calls == []
    plan = plans["central"]
    central_noise(plan, "tree", rnd)
    central_noise(plan, "init", rnd)
    assert central_noise(plan, "eval", rnd) is None  # the sites noised it in full
    assert [c[0] for c in rnd.calls] == ["gaussian", "laplace"]
    assert np.array_equal(rnd.calls[0][1], plan.releases["tree"].scales(1))
    assert np.array_equal(rnd.calls[1][1], plan.releases["init"].scales())
    ahead = Ahead()
    assert central_noise(plan, "tree", rnd, ahead=ahead).tolist() == [7, 7, 7] and ahead.keys == [None]
