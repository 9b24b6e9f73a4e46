"""The site's exact noise drawn in child processes (client/isolated_noise.py) and its share buffer.

The sampler itself is tested in tests/test_exact_noise.py; here: the child
returns exact draws of the requested kinds and shapes from the secure
source (never the same vector twice), reports bad parameters as the
in-process sampler does, and NoiseShares hands out the pre-drawn block first
and refills it from a child before it runs dry.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fedsbdt.client.isolated_noise import IsolatedSampler
from fedsbdt.client.noise import SPARE_SHARES, isolated_shares
from fedsbdt.common.randomness import InsecureTestRandomness, SecureRandomness


@pytest.fixture
def sampler():
    return IsolatedSampler(SecureRandomness())


def test_draws_have_the_requested_kinds_shapes_and_variances(sampler):
    sigma, b = 40.0, 25.0
    g, lap, zero = sampler.draw([("gaussian", np.full((50, 80), sigma)), ("laplace", np.full(4000, b)),
                                 ("gaussian", np.zeros(3))])
    assert g.dtype == lap.dtype == np.int64 and g.shape == (50, 80) and lap.shape == (4000,)
    assert np.array_equal(zero, np.zeros(3, np.int64))
    # N_Z(0, σ²): variance σ² within 1e-10 relative at σ = 40; Lap_Z(b): 2e^{-1/b}/(1 − e^{-1/b})²
    var_lap = 2 * np.exp(-1 / b) / (1 - np.exp(-1 / b)) ** 2
    for x, var in ((g.ravel(), sigma**2), (lap, var_lap)):
        # mean square of n draws: standard error √(Var(X²)/n) ≤ √(6 var²/n) (kurtosis ≤ 6); 5 standard errors
        assert abs(np.mean(x.astype(float) ** 2) - var) < 5 * np.sqrt(6 * var**2 / x.size)
        assert abs(x.mean()) < 5 * np.sqrt(var / x.size)
    assert sampler.children >= 1


def test_every_call_draws_fresh_noise(sampler):
    a = sampler.draw([("gaussian", np.full(64, 1e6))])[0]
    b = sampler.draw([("gaussian", np.full(64, 1e6))])[0]
    assert sampler.children == 2
    assert not np.array_equal(a, b)  # equal with probability < 1e-300


def test_frequent_single_draws_move_into_the_daemon(sampler, caplog):
    """A second direct draw within a minute is drawn in this process (no child), and stays fresh and exact."""
    log = logging.getLogger("fedsbdt.site")  # an earlier CLI test may have stopped it propagating to the root
    log.addHandler(caplog.handler)
    try:
        first = sampler.discrete_gaussian(np.full(64, 1e6))
        assert sampler.children == 1 and not sampler.in_process
        second = sampler.discrete_gaussian(np.full(64, 1e6))
        third = sampler.discrete_laplace(np.full(3, 2.0))
    finally:
        log.removeHandler(caplog.handler)
    assert sampler.children == 1 and sampler.in_process
    assert "in the site process" in caplog.text
    assert second.dtype == third.dtype == np.int64 and third.shape == (3,)
    assert not np.array_equal(first, second)
    sampler.draw([("gaussian", np.ones(2))])  # blocks still come from children
    assert sampler.children == 2


def test_bad_parameters_are_reported_like_the_in_process_sampler(sampler):
    with pytest.raises(ValueError) as direct:
        SecureRandomness().discrete_laplace(np.array([2.0**50]))
    with pytest.raises(ValueError) as isolated:
        sampler.discrete_laplace(np.array([2.0**50]))
    assert str(isolated.value) == str(direct.value)
    with pytest.raises(ValueError, match="unknown noise kind"):
        sampler.draw([("uniform", np.ones(2))])
    with pytest.raises(TypeError):
        IsolatedSampler(InsecureTestRandomness(i_understand_this_is_insecure=True))


def test_shares_start_with_the_first_block_and_refill_from_a_child(sampler):
    before = sampler.children
    scales = {3: np.full(16, 100.0), 2: np.full(16, 130.0)}
    shares, init = isolated_shares(sampler, scales, 3, rounds=20, init_scales=np.array([2.0, 5.0]))
    try:
        assert init.shape == (2,) and sampler.children == before + 1  # one child: first block and initial share
        assert shares.chunk == 28 and shares.low == 8  # one block covers the 20 rounds
        taken = []
        for _ in range(3):  # more than two blocks: the thread refills from a child once `low` are left
            taken += [shares.take(3) for _ in range(len(shares._ready[3]) - shares.low + 1)]
            deadline = time.monotonic() + 120
            while len(shares._ready[3]) < shares.low and time.monotonic() < deadline:
                time.sleep(0.01)
        assert all(t.shape == (16,) and t.dtype == np.int64 for t in taken)
        assert len({t.tobytes() for t in taken}) == len(taken)  # never the same vector twice
        assert sampler.children >= before + 3 and not sampler.in_process  # refilled by children in time
        spares = [r.copy() for r in shares._ready[2]]
        assert len(spares) == SPARE_SHARES  # drawn with the first block
        n = sampler.children
        others = [shares.take(2) for _ in range(4)]  # another divisor: its spares, no child on the way
        assert all(np.array_equal(o, s) for o, s in zip(others, spares))
        assert sampler.children <= n + 1  # at most the background block for divisor 2 started meanwhile
        assert all(o.shape == (16,) for o in others) and len({o.tobytes() for o in others}) == 4
    finally:
        shares.close()


def test_compiled_samplers_serve_every_noise_child_from_numba_s_cache(tmp_path, monkeypatch):
    """``compile_samplers`` (the image build's step, Dockerfile) leaves in the cache every kernel a site's
    noise child needs: children drawing both kinds at scales from below 1 to 10⁶ afterwards compile nothing
    (numba writes no file and updates no index)."""
    cache = tmp_path / "numba"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    subprocess.run([sys.executable, "-c", "from fedsbdt.client.isolated_noise import compile_samplers; "
                    "compile_samplers()"], check=True, timeout=600)
    before = {p.name: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert any(name.endswith(".nbc") for name in before)
    scales = np.array([0.3, 1.0, 7.5, 123.25, 4e4, 2.5e6])
    sampler = IsolatedSampler(SecureRandomness())
    sampler.draw([("gaussian", scales), ("laplace", scales)])
    sampler.draw([("gaussian", np.zeros(2))])
    after = {p.name: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert after == before


class SlowChildSampler(IsolatedSampler):
    """The real isolated sampler whose block children do not finish until ``release`` is set: a child on a
    loaded host (load 8–14 measured tens of seconds for one)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.release = threading.Event()
        self.blocked = threading.Event()

    def draw(self, requests):
        if self.children >= 1:  # the first block (the session's start) comes at once; later ones hang
            self.blocked.set()
            assert self.release.wait(120)
        return super().draw(requests)


def test_a_membership_change_never_waits_for_a_child_the_share_is_drawn_in_process(caplog):
    """Issue 36 item 4: after a dropout the round's divisor changes; its spare shares run out while the child
    drawing its block is still running.  The next share must come at once (drawn in this process, fresh and
    of the divisor's variance), not after the child: the round would miss its stage deadline."""
    sampler = SlowChildSampler(SecureRandomness())
    scales = {3: np.full(16, 100.0), 2: np.full(16, 130.0)}
    shares, _ = isolated_shares(sampler, scales, 3, rounds=20)
    log = logging.getLogger("fedsbdt.site")
    log.addHandler(caplog.handler)
    result: list = []
    try:
        spares = [shares.take(2) for _ in range(SPARE_SHARES)]  # divisor 2's spares; its block child starts
        assert sampler.blocked.wait(60)  # ... and hangs
        worker = threading.Thread(target=lambda: result.extend(shares.take(2) for _ in range(20)), daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "a round waited for the noise child"
        assert sampler.in_process and sampler.children == 1
        got = spares + result
        assert all(v.shape == (16,) and v.dtype == np.int64 for v in got)
        assert len({v.tobytes() for v in got}) == len(got)  # never the same vector twice
        assert any("drawing them in the site process" in r.getMessage() for r in caplog.records)
        big = np.stack([shares.take(2) for _ in range(200)]).ravel() / 130.0  # still the divisor's σ
        assert abs(float(np.mean(big**2)) - 1.0) < 5 * np.sqrt(2.0 / big.size)
    finally:
        log.removeHandler(caplog.handler)
        sampler.release.set()
        shares.close()
