"""End-to-end correctness: masks cancel, dropout matrix, threshold boundaries, epochs."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsbdt.common.fixedpoint import FixedPointCodec, FixedPointError, from_ring, to_ring
from fedsbdt.common.secagg import ConfigError, ProtocolAbort, SecAggError, SessionConfig, SiteIdentity
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg.site import EpochReady

from .conftest import identities, make_config, make_federation, plain_sum, random_inputs, site_ids

D = 16


def test_masks_cancel_exactly():
    """Sum of masked inputs minus only the self masks equals the plain sum: pair masks cancel."""
    fed = make_federation(5, 3)
    fed.run_epoch(1)
    rng = np.random.default_rng(0)
    xs = random_inputs(fed.config.site_ids, D, rng)
    rnd, start = fed.coordinator.begin_round(D)
    ys = {s: fed.to_site(s, start, xs[s]) for s in start.participants}
    total = np.zeros(D, dtype=np.uint64)
    for y in ys.values():
        total += y.masked
    # the masked vectors alone look nothing like the inputs
    for s in xs:
        assert not np.array_equal(from_ring(ys[s].masked), xs[s])
    for s in start.participants:
        ep = fed.sites[s]._epochs[start.epoch]
        assert isinstance(ep, EpochReady)
        seed = ep.secrets.seeds[0]
        total -= P.prg_expand(P.self_mask_key(seed, fed.config.digest, start.epoch, start.round_id, s, D), D)
    assert np.array_equal(from_ring(total), plain_sum(xs, start.participants))


def test_full_round_no_dropout_and_wraparound_values():
    fed = make_federation(4, 3)
    fed.run_epoch(3)
    rng = np.random.default_rng(1)
    big = np.iinfo(np.int64)
    xs = random_inputs(fed.config.site_ids, D, rng)
    xs["site-00"][0] = big.max // 4  # large magnitudes wrap inside the ring but the sum is exact
    xs["site-01"][0] = big.min // 4
    res = fed.run_round(xs, D)
    assert res.survivors == fed.config.site_ids and res.dropped == ()
    assert res.total.dtype == np.int64
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))


def test_fixed_point_pipeline_with_noise_hook():
    """Floats are encoded by the caller; the site adds an int64 noise share; output = exact integer sum."""
    codec = FixedPointCodec(bound=4.0)
    fed = make_federation(3, 2, config_kw={"max_abs_input": codec.bound_units, "noise_sigma_units": 1000.0})
    fed.run_epoch(1)
    rng = np.random.default_rng(2)
    floats = {s: rng.uniform(-5, 5, D) for s in fed.config.site_ids}
    xs = {s: codec.encode(v) for s, v in floats.items()}
    noise = {s: rng.integers(-3000, 3000, D, dtype=np.int64) for s in xs}
    res = fed.run_round(xs, D, noise=noise)
    assert np.array_equal(res.total, plain_sum(xs, res.survivors) + plain_sum(noise, res.survivors))
    np.testing.assert_allclose(
        codec.decode(res.total - plain_sum(noise, res.survivors)),
        sum(np.clip(np.rint(v * codec.scale), -codec.bound_units, codec.bound_units) for v in floats.values()) / codec.scale,
    )


def test_site_refuses_floats_and_out_of_range_inputs():
    fed = make_federation(3, 2, config_kw={"max_abs_input": 100, "noise_sigma_units": 1.0})
    fed.run_epoch(4)
    _, start = fed.coordinator.begin_round(3)
    site = fed.sites["site-00"]
    with pytest.raises(TypeError, match="int64"):
        site.handle_round_start(start, np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        site.handle_round_start(start, np.zeros(4, dtype=np.int64))
    with pytest.raises(FixedPointError, match="bound"):
        site.handle_round_start(start, np.array([0, 101, 0], dtype=np.int64))
    with pytest.raises(FixedPointError, match="bound"):
        site.handle_round_start(start, np.zeros(3, dtype=np.int64), noise=np.array([0, 0, -(10**6)], dtype=np.int64))
    with pytest.raises(TypeError):
        site.handle_round_start(start, None)
    assert site.round_stage(start.round_id) is None  # nothing was sent or persisted
    site.handle_round_start(start, np.array([0, 100, -100], dtype=np.int64))
    assert site.round_stage(start.round_id) == "input-sent"


STAGES = ("advertise", "share", "ready", "input", "consistency", "unmask")


def run_with_drops(n: int, t: int, drops: dict[str, set[str]], seed: int = 0):
    """Run one epoch (E=1) and one round with the given per-stage drop sets.

    Returns ("ok", result, inputs) or ("abort", stage) where stage is the first
    stage whose survivor count fell below t.
    """
    fed = make_federation(n, t)
    rng = np.random.default_rng(seed)
    xs = random_inputs(fed.config.site_ids, 6, rng)
    try:
        fed.run_epoch(1, drops["advertise"], drops["share"], drops["ready"])
    except ProtocolAbort:
        return ("abort", "epoch", None)
    not_ready = drops["advertise"] | drops["share"] | drops["ready"]
    try:
        res = fed.run_round(
            xs, 6, None, drops["input"] | not_ready, drops["consistency"], drops["unmask"]
        )
    except ProtocolAbort:
        return ("abort", "round", None)
    return ("ok", res, xs)


def expected_outcome(n: int, t: int, drops: dict[str, set[str]]):
    alive = set(site_ids(n))
    for stage in STAGES:
        alive -= drops[stage]
        if stage == "ready":
            continue  # dropping after ShareKeys is only noticed when the round starts
        if len(alive) < t:
            return ("abort", "epoch" if stage in ("advertise", "share") else "round", None)
        if stage == "input":
            u3 = tuple(sorted(alive))
    return ("ok", u3)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.data())
def test_dropout_matrix_property(data):
    """Drop 0 … n − t sites spread over the six stages (sometimes n − t + 1, which must abort)."""
    n = data.draw(st.integers(2, 10), label="n")
    t = data.draw(st.integers(n // 2 + 1, n), label="t")
    ids = list(site_ids(n))
    total = data.draw(st.sampled_from(range(n - t + 2)), label="total drops")
    victims = data.draw(st.permutations(ids), label="order")[:total]
    drops: dict[str, set[str]] = {stage: set() for stage in STAGES}
    for v in victims:
        drops[data.draw(st.sampled_from(STAGES), label=f"stage of {v}")].add(v)
    outcome = run_with_drops(n, t, drops)
    expected = expected_outcome(n, t, drops)
    assert outcome[0] == expected[0], (drops, outcome[:2], expected)
    if expected[0] == "ok":
        _, res, xs = outcome
        assert res.survivors == expected[1]
        assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    else:
        assert outcome[1] == expected[1]


@pytest.mark.parametrize("n", [6, 8, 10])
def test_dropout_matrix_every_drop_count(n):
    """For every total 0 … n − t + 1, drops spread over random stages (seeded)."""
    t = n // 2 + 1
    rng = np.random.default_rng(n)
    ids = list(site_ids(n))
    for total in range(n - t + 2):
        victims = list(rng.permutation(ids)[:total])
        drops = {stage: set() for stage in STAGES}
        for v in victims:
            drops[STAGES[rng.integers(len(STAGES))]].add(str(v))
        outcome = run_with_drops(n, t, drops, seed=total)
        expected = expected_outcome(n, t, drops)
        assert outcome[0] == expected[0] == ("ok" if total <= n - t else "abort"), drops
        if total <= n - t:
            _, res, xs = outcome
            assert res.survivors == expected[1]
            assert np.array_equal(res.total, plain_sum(xs, res.survivors))


@pytest.mark.parametrize("stage", STAGES)
def test_exactly_t_survivors_succeed_and_t_minus_1_abort(stage):
    n, t = 7, 4
    ids = list(site_ids(n))
    none = {s: set() for s in STAGES}
    ok = dict(none, **{stage: set(ids[: n - t])})
    outcome = run_with_drops(n, t, ok)
    assert outcome[0] == "ok"
    _, res, xs = outcome
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    if stage in ("advertise", "share", "ready", "input"):
        assert len(res.survivors) == t
    bad = dict(none, **{stage: set(ids[: n - t + 1])})
    outcome = run_with_drops(n, t, bad)
    assert outcome[0] == "abort"


def test_threshold_rules():
    keys = identities(5)
    roster = tuple(SiteIdentity(s, k.public_key().public_bytes_raw()) for s, k in keys.items())
    SessionConfig(b"s", 3, roster)
    with pytest.raises(ConfigError, match="2t > n"):
        SessionConfig(b"s", 2, roster)  # t must exceed n/2
    with pytest.raises(ConfigError, match="2t > n"):
        SessionConfig(b"s", 3, roster, assumed_colluders=1)  # malicious coordinator: 2t > n + c
    SessionConfig(b"s", 4, roster, assumed_colluders=2)
    with pytest.raises(ConfigError, match="exceeds the roster"):
        SessionConfig(b"s", 6, roster)
    with pytest.raises(ConfigError, match="twice"):
        SessionConfig(b"s", 3, roster + roster[:1])
    with pytest.raises(ConfigError, match="between 2"):
        SessionConfig(b"s", 1, roster[:1])
    with pytest.raises(ConfigError, match="overflow"):
        SessionConfig(b"s", 3, roster, max_abs_input=2**62)
    with pytest.raises(ConfigError, match="valid site id"):
        SiteIdentity("bad id", b"\x00" * 32)
    # the digest binds the threshold, the session id and the roster
    base = make_config(5, 3)
    assert base.digest != make_config(5, 4).digest
    assert base.digest != make_config(5, 3, session_id=b"other").digest
    assert base.digest != make_config(4, 3).digest
    assert base.digest == make_config(5, 3).digest


def test_site_requires_its_pinned_identity():
    from fedsbdt.common.secagg import MemoryStorage, SecAggSite

    cfg = make_config(3)
    with pytest.raises(SecAggError, match="does not match"):
        SecAggSite(cfg, "site-00", identities(3)["site-01"], MemoryStorage())
    with pytest.raises(SecAggError, match="not in the session roster"):
        SecAggSite(cfg, "site-99", identities(3)["site-01"], MemoryStorage())


def test_many_rounds_across_epochs_with_fresh_round_ids():
    fed = make_federation(4, 3)
    rng = np.random.default_rng(3)
    seen_ids = []
    for _ in range(3):
        fed.run_epoch(2)
        for _ in range(2):
            xs = random_inputs(fed.config.site_ids, 4, rng)
            res = fed.run_round(xs, 4)
            seen_ids.append(res.round_id)
            assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    assert seen_ids == sorted(set(seen_ids))
    with pytest.raises(SecAggError, match="no ready epoch"):
        fed.coordinator.begin_round(4)


def test_prepare_next_epoch_while_current_runs():
    """Epoch k+1's setup is interleaved with epoch k's rounds; rounds continue seamlessly."""
    fed = make_federation(5, 3)
    rng = np.random.default_rng(4)
    fed.run_epoch(2)
    coord = fed.coordinator
    setup, ann = coord.begin_epoch(2)
    assert ann.first_round == 2
    for s in fed.config.site_ids:
        setup.receive_advertise(fed.to_site(s, ann))
    xs = random_inputs(fed.config.site_ids, 4, rng)
    assert np.array_equal(fed.run_round(xs, 4).total, plain_sum(xs, fed.config.site_ids))
    roster = setup.close_advertise()
    for s in roster.senders:
        setup.receive_share_keys(fed.to_site(s, roster))
    xs = random_inputs(fed.config.site_ids, 4, rng)
    res = fed.run_round(xs, 4, drop_before_consistency=["site-02"])
    assert res.epoch == 0 and np.array_equal(res.total, plain_sum(xs, res.survivors))
    for s, msg in setup.close_share_keys().items():
        fed.to_site(s, msg)
    for expected_round in (2, 3):
        xs = random_inputs(fed.config.site_ids, 4, rng)
        res = fed.run_round(xs, 4)
        assert (res.epoch, res.round_id) == (1, expected_round)
        assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    # the finished epoch's secrets are gone from every site's storage
    for s in fed.config.site_ids:
        assert not fed.storages[s].keys("epoch/00000000000000000000")


def test_excluded_site_left_out_and_its_material_never_revealed():
    fed = make_federation(5, 3)
    fed.run_epoch(3)
    rng = np.random.default_rng(5)
    xs = random_inputs(fed.config.site_ids, 4, rng)
    res = fed.run_round(xs, 4, drop_before_input=["site-04"])
    assert "site-04" in res.dropped
    fed.coordinator.exclude("site-04")
    start_hop = len(fed.transcript)
    for _ in range(2):
        xs = random_inputs(fed.config.site_ids, 4, rng)
        res = fed.run_round(xs, 4)
        assert "site-04" not in res.participants
        assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    for hop in fed.transcript[start_hop:]:
        m = hop.message
        if hasattr(m, "seed_shares"):
            assert "site-04" not in dict(m.seed_shares) and "site-04" not in dict(m.key_shares)


def test_ring_helpers_roundtrip():
    v = np.array([-1, 0, 2**62], dtype=np.int64)
    assert np.array_equal(from_ring(to_ring(v)), v)


def test_coordinator_itself_aborts_each_stage_below_t():
    """The coordinator refuses to proceed with fewer than t (independently of the sites' own checks)."""
    fed = make_federation(5, 3)
    coord = fed.coordinator
    setup, ann = coord.begin_epoch(4)
    adverts = {s: fed.sites[s].handle_epoch_announce(ann) for s in fed.config.site_ids}
    for s in ("site-00", "site-01"):
        setup.receive_advertise(adverts[s])
    with pytest.raises(ProtocolAbort, match="only 2 sites advertised"):
        setup.close_advertise()
    assert setup.stage.name == "aborted"
    fed.run_epoch(4)
    xs = random_inputs(fed.config.site_ids, D, np.random.default_rng(9))
    for stage in ("inputs", "signatures", "shares"):
        rnd, start = coord.begin_round(D)
        ys = {s: fed.sites[s].handle_round_start(start, xs[s]) for s in start.participants}
        senders = list(start.participants) if stage != "inputs" else ["site-00", "site-01"]
        for s in senders:
            rnd.receive(ys[s])
        if stage == "inputs":
            with pytest.raises(ProtocolAbort, match="only 2 masked inputs"):
                rnd.close_inputs()
            assert rnd.stage.name == "failed"
            continue
        creq = rnd.close_inputs()
        sigs = {s: fed.sites[s].handle_consistency_request(creq) for s in creq.survivors}
        for s in (list(sigs) if stage != "signatures" else ["site-00", "site-01"]):
            rnd.receive(sigs[s])
        if stage == "signatures":
            with pytest.raises(ProtocolAbort, match="only 2 consistency signatures"):
                rnd.close_consistency()
            assert rnd.stage.name == "failed"
            continue
        ureq = rnd.close_consistency()
        for s in ("site-00", "site-01"):
            rnd.receive(fed.sites[s].handle_unmask_request(ureq))
        with pytest.raises(ProtocolAbort, match="only 2 unmask responses"):
            rnd.finalize()
        assert rnd.stage.name == "failed"
