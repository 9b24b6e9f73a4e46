"""The per-round noise divisor k_r = max(t, |P_r| − s) − c (plan key ``session.dropout_slack = s``).

Each site splits a round's leaf noise into k_r shares, k_r recomputed from the
public plan and the RoundStart's participant set, and signs the survivor set
U3 only if |U3| − c ≥ k_r.  So every released sum carries at least σ² of
honest noise, exactly σ² with s = 0 and no dropout.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2

from fedsbdt.client.noise import NoiseShares
from fedsbdt.common.boosting import leaf_noise_scales
from fedsbdt.common.randomness import SecureRandomness
from fedsbdt.common.secagg import ConsistencyRequest, decode_message
from fedsbdt.common.federation.wire import Purpose, Refusal, RoundMsg, RoundReply, RoundStartMsg

from .test_state_machines import SITES, Fed, tree_hp


def _chi2_bounds(n: int, p: float = 1e-6) -> tuple[float, float]:
    """Two-sided bounds on mean(z²) for n independent standard normal z (probability 1 − p inside: a correct sampler fails it once in a million runs)."""
    lo, hi = chi2.ppf([p / 2, 1 - p / 2], n)
    return lo / n, hi / n


def _record_takes(f: Fed) -> dict[str, list[int]]:
    """Wrap every site's noise source to record the divisor k each round's share was drawn for."""
    ks: dict[str, list[int]] = {s: [] for s in SITES}
    for s, m in f.machines.items():
        def take(k, take=m.noise.take, s=s):
            ks[s].append(k)
            return take(k)

        m.noise.take = take
    return ks


@pytest.mark.parametrize("slack,signs", [(0, False), (1, True)])
def test_a_site_signs_a_survivor_set_only_if_it_carries_sigma2(tmp_path, slack, signs):
    """P_r = all three sites.  s = 0: shares of σ²/3, so a forged U3 of two sites (2σ²/3) is refused and the
    round is aborted at the site; s = n − t = 1: shares of σ²/2, two survivors carry σ², the site signs."""
    f = Fed(tmp_path, tree_hp(trees=4), dropout_slack=slack, secagg_fast_path="never").start()  # U3 is asked for
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    caught: dict = {}

    def intercept(site, ev):
        if site == "hosp-a" and isinstance(ev, RoundMsg) and "req" not in caught:
            msg = decode_message(ev.secagg)
            if isinstance(msg, ConsistencyRequest):
                caught["req"] = msg
                return False
        return True

    f.fed.intercept = intercept
    f.fed.run(until=lambda: "req" in caught)
    f.fed.intercept = None
    real = caught["req"]
    assert real.survivors == tuple(SITES)
    m = f.machines["hosp-a"]
    forged = ConsistencyRequest(real.session_digest, real.epoch, real.round_id, ("hosp-a", "hosp-b"))
    out = m.handle(RoundMsg(forged.to_bytes()))
    signed_key = f"round/{real.round_id:020d}/signed"
    n_signed = f.db("hosp-a").execute("SELECT COUNT(*) FROM secagg WHERE key = ?", (signed_key,)).fetchone()[0]
    if signs:
        assert isinstance(out[0], RoundReply) and n_signed == 1
    else:
        assert isinstance(out[0], Refusal) and "at least 3" in out[0].detail, out
        assert n_signed == 0 and m.secagg.round_stage(real.round_id) == "aborted"
        again = m.handle(RoundMsg(real.to_bytes()))  # aborted for good: not even the genuine request is signed
        assert isinstance(again[0], Refusal)
        f.fed.route("hosp-a", again[0])
    f.fed.run()  # the others finish the round; the session goes on
    assert f.session.exit_code == 0


@pytest.mark.parametrize("slack,shares", [(0, 3), (1, 2)])
def test_the_released_noise_has_variance_sigma2_without_slack(tmp_path, monkeypatch, slack, shares):
    """Released sum − Σ data sums over U3, in units of the calibrated σ per coordinate, over 40 rounds of
    32 coordinates: mean square ≈ 1 with s = 0 (three shares of σ²/3), ≈ 3/2 with s = n − t (the old rule:
    three shares of σ²/2).  The shares come from the secure sampler (the deterministic test source would
    give every site the same draws); the scales are the ones the sites derive from the plan."""
    import fedsbdt.client.site

    monkeypatch.setattr(fedsbdt.client.site, "NoiseShares",
                        lambda randomness, scales, **kw: NoiseShares(SecureRandomness(), scales, **kw))
    hp = tree_hp(trees=40, depth=4)
    f = Fed(tmp_path, hp, dropout_slack=slack)
    ks = _record_takes(f)
    sums: dict[tuple[str, int], np.ndarray] = {}
    for s, m in f.machines.items():
        def contribution(splits, k, *a, contribution=m.local.contribution, s=s, **kw):
            c = contribution(splits, k, *a, **kw)
            sums[(s, k)] = np.asarray(c.sums, np.int64).copy()
            return c

        m.local.contribution = contribution
    released = []
    release = f.session._release

    def record_release(work, result, now, out):
        released.append((work, tuple(result.survivors), np.asarray(result.total, np.int64).copy()))
        return release(work, result, now, out)

    f.session._release = record_release
    f.start()
    f.fed.run()
    assert f.session.exit_code == 0 and f.session.rounds_failed == 0
    assert all(k == [shares] * hp.trees for k in ks.values())
    full = leaf_noise_scales(hp, f.plan.encoding, f.plan.verify_privacy().sigma)
    z = np.concatenate([(total - sum(sums[(s, w.tree)] for s in surv)) / full
                        for w, surv, total in released if w.purpose == Purpose.TREE])
    assert z.size == hp.trees * 2 * hp.leaves
    lo, hi = _chi2_bounds(z.size)
    expected = len(SITES) / shares
    assert lo * expected <= float(np.mean(z**2)) <= hi * expected


def test_a_dropout_without_slack_is_retried_among_the_remaining_sites(tmp_path):
    """s = 0: a site lost before its masked input leaves two survivors of shares split three ways; the
    coordinator does not ask for signatures, retries in a new slot with P_r of two (k_r = 2) and finishes."""
    f = Fed(tmp_path, tree_hp(trees=5), test_noise=True)
    ks = _record_takes(f)
    f.start()
    f.fed.run(until=lambda: len(f.session.trees) == 2)

    def intercept(site, ev):
        if site == "hosp-c" and isinstance(ev, RoundStartMsg):
            f.fed.crash("hosp-c")
            return False
        return True

    f.fed.intercept = intercept
    f.fed.run(until=lambda: len(f.session.trees) == 3)
    f.fed.intercept = None
    assert f.session.rounds_failed == 1
    f.fed.run()
    assert f.session.exit_code == 0
    assert [t.sites for t in f.session.trees] == [tuple(SITES)] * 2 + [("hosp-a", "hosp-b")] * 3
    assert ks["hosp-a"] == ks["hosp-b"] == [3, 3, 3, 2, 2, 2]  # tree 2: the failed attempt, then the retry
    assert ks["hosp-c"] == [3, 3]
    # the failed attempt cost its participants a contribution (it cannot be refunded)
    n = f.db("hosp-a").execute("SELECT COUNT(*) FROM contributions WHERE tree = 2").fetchone()[0]
    assert n == 2
    assert not any("at least" in d for _, d in f.fed.refusals)  # no site was asked to sign a short U3


def test_noise_shares_are_drawn_per_divisor_by_the_secure_sampler_and_used_once():
    """The background sampler follows the divisor asked for; every share has variance σ²/k and is new."""
    base = 1000.0
    scales = {k: np.full(16, base / np.sqrt(k)) for k in (2, 3)}
    ns = NoiseShares(SecureRandomness(), scales, chunk=4, ahead=2, expect=3)
    draws: dict[int, list[np.ndarray]] = {2: [], 3: []}
    try:
        for k in [3] * 50 + [2] * 50 + [3] * 20:
            v = ns.take(k)
            assert v.dtype == np.int64 and v.shape == (16,)
            draws[k].append(v)
    finally:
        ns.close()
    seen = {v.tobytes() for vs in draws.values() for v in vs}
    assert len(seen) == 120  # no vector handed out twice
    for k, vs in draws.items():
        z = np.stack(vs).ravel() / scales[k][0]
        lo, hi = _chi2_bounds(z.size)
        assert lo <= float(np.mean(z**2)) <= hi, k
    with pytest.raises(KeyError):
        NoiseShares(SecureRandomness(), scales, expect=4)


def test_the_background_sampler_refills_what_is_taken():
    """Shares are drawn ahead: after the buffer is emptied, the thread fills it again (for the divisor asked for
    last) without any further take — so a site's noise is drawn while it waits, not on the round's path."""
    import time

    scales = {k: np.full(16, 1000.0 / np.sqrt(k)) for k in (2, 3)}
    ns = NoiseShares(SecureRandomness(), scales, chunk=4, ahead=2, expect=3)

    def wait_full(k):
        deadline = time.monotonic() + 30
        while len(ns._ready[k]) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(ns._ready[k])

    try:
        for k in (3, 2):
            ns.take(k)  # switches the thread to divisor k
            assert wait_full(k) >= 8
            for _ in range(8):
                ns.take(k)
            assert wait_full(k) >= 8  # refilled in the background
    finally:
        ns.close()


def test_fedsbdt_plan_writes_and_validates_the_dropout_slack(tmp_path, capsys):
    import json

    from fedsbdt.cli import main
    from fedsbdt.common.federation.plan import Plan

    from .conftest import EXAMPLES

    keys = [bytes([i + 1]) * 32 for i in range(3)]
    base = ["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), "--settings", "paper",
            "--trees", "5", "--seed", "1",
            "--json", *[a for i, k in enumerate(keys) for a in ("--site", f"s{i}={k.hex()}")]]
    assert main([*base, "--out", str(tmp_path / "p.toml"), "--dropout-slack", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dropout_slack"] == 1 and Plan.load(tmp_path / "p.toml").dropout_slack == 1
    assert main([*base, "--out", str(tmp_path / "q.toml")]) == 0
    assert Plan.load(tmp_path / "q.toml").dropout_slack == 0
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "r.toml"), "--dropout-slack", "2"]) == 2  # n − t = 1
    assert "dropout_slack = 2" in capsys.readouterr().err and not (tmp_path / "r.toml").exists()
