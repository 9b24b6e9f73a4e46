"""The fast round: one exchange (FastRoundStart → FastMaskedInput), finalized only when all of P_r sent.

docs/secagg.md §6 "Fast rounds" states why it is safe: every honest site takes exactly one action per
round — the fast reveal (seed shares of all of P_r, signs nothing) or the signed path — so obtaining
both b_u and u's round key needs (n − c) + 2c ≥ 2t, which 2t > n + c rules out.  These tests check
the sums, the persistence of "answered fast", every refusal, and the mixed-path attack (with a negative
control one colluder above the bound, so the attack test can fail).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsbdt.common.secagg import (
    ConfigError,
    FastMaskedInput,
    FastRoundStart,
    InvalidMessage,
    OutOfOrder,
    ProtocolAbort,
    ReplayError,
)
from fedsbdt.common.secagg import messages as M

from .conftest import make_federation, plain_sum, random_inputs

DIM = 5


def ready(n=5, t=3, e=4, **kw):
    fed = make_federation(n, t, **kw)
    fed.run_epoch(e)
    return fed


# --------------------------------------------------------------------------- masks cancel

@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.data())
def test_fast_rounds_give_the_exact_sum_over_p_r(data):
    n = data.draw(st.integers(2, 10), label="n")
    t = data.draw(st.integers(n // 2 + 1, n), label="t")
    d = data.draw(st.integers(1, 40), label="d")
    fed = ready(n, t, e=3)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    ids = fed.config.site_ids
    k = data.draw(st.integers(t, n), label="|P_r|")
    p = tuple(sorted(rng.choice(ids, size=k, replace=False)))
    xs = random_inputs(ids, d, rng, bound=2**62)
    res = fed.run_round(xs, d, participants=p, fast=True)
    assert fed.last_round.fast
    assert res.survivors == res.participants == p and res.dropped == () and res.blamed == ()
    assert res.total.dtype == np.int64
    assert np.array_equal(res.total, plain_sum(xs, p))  # exact, wrapping mod 2^64 like int64


@pytest.mark.parametrize("n, t", [(5, 3), (12, 7)])
def test_an_honest_fast_round_is_interpolated_right_the_first_time(n, t, monkeypatch):
    """The batch interpolation of the first t holders' share bytes (shamir.reconstruct_many_packed) opens every
    seed's commitment: no commitment row is read (the blame path, which would hide a wrong fast path by
    recovering the seeds share by share, never runs)."""
    from fedsbdt.common.secagg.coordinator import CoordinatorEpoch

    rows_read = []
    row = CoordinatorEpoch.row
    monkeypatch.setattr(CoordinatorEpoch, "row", lambda ep, d, h: rows_read.append((d, h)) or row(ep, d, h))
    fed = ready(n, t)
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(n))
    res = fed.run_round(xs, DIM, fast=True)  # the replies reach the round as bytes, decoded in bulk
    assert np.array_equal(res.total, plain_sum(xs, res.participants)) and res.blamed == ()
    assert rows_read == []


def test_mixed_fast_and_slow_rounds_in_one_epoch():
    fed = ready(6, 4, e=6)
    rng = np.random.default_rng(7)
    ids = fed.config.site_ids
    plan = [(True, ()), (False, ("site-02",)), (True, ()), (False, ()), (True, ()), (False, ("site-05",))]
    for fast, drop in plan:
        xs = random_inputs(ids, DIM, rng)
        res = fed.run_round(xs, DIM, drop_before_input=drop, fast=fast)
        assert fed.last_round.fast == fast
        assert np.array_equal(res.total, plain_sum(xs, res.survivors))
        assert set(res.survivors) == set(ids) - set(drop)
    assert fed.coordinator.slots_remaining() == 0


def test_fast_api_shape():
    fed = ready()
    rnd, start = fed.coordinator.begin_round(DIM, fast=True)
    assert isinstance(start, FastRoundStart) and start.fast and rnd.fast
    assert M.decode_message(start.to_bytes()) == start
    assert rnd.awaiting() == start.participants and rnd.survivors == ()
    with pytest.raises(OutOfOrder):
        rnd.close_inputs()
    with pytest.raises(OutOfOrder):
        rnd.close_consistency()
    rng = np.random.default_rng(3)
    xs = random_inputs(start.participants, DIM, rng)
    for i, s in enumerate(start.participants):
        reply = fed.to_site(s, start, xs[s])
        assert isinstance(reply, FastMaskedInput)
        assert tuple(d for d, _ in reply.seed_shares) == start.participants
        rnd.receive(reply.to_bytes())
        assert rnd.survivors == start.participants[: i + 1]
        assert fed.sites[s].round_stage(start.round_id) == "answered-fast"
    assert rnd.awaiting() == ()
    res = rnd.finalize()
    assert np.array_equal(res.total, plain_sum(xs, start.participants))
    # a slow round's RoundStart is unchanged: not fast, its own tag
    rnd2, start2 = fed.coordinator.begin_round(DIM)
    assert not start2.fast and not rnd2.fast and type(start2) is M.RoundStart
    assert start2.to_bytes()[4] == M.RoundStart.TAG


def test_slow_round_refuses_fast_replies_and_fast_round_refuses_slow_ones():
    fed = ready()
    rng = np.random.default_rng(4)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    slow, s_start = fed.coordinator.begin_round(DIM)
    y_slow = fed.sites["site-00"].handle_round_start(s_start, xs["site-00"])
    fast, f_start = fed.coordinator.begin_round(DIM, fast=True)
    y_fast = fed.sites["site-00"].handle_round_start(f_start, xs["site-00"])
    forged = FastMaskedInput(y_slow.session_digest, y_slow.epoch, y_slow.round_id, y_slow.sender, y_slow.masked,
                             y_fast.seed_shares)
    with pytest.raises(InvalidMessage):
        slow.receive(forged)
    plain = M.MaskedInput(y_fast.session_digest, y_fast.epoch, y_fast.round_id, y_fast.sender, y_fast.masked)
    with pytest.raises(InvalidMessage):
        fast.receive(plain)
    assert fast.awaiting() == f_start.participants


# --------------------------------------------------------------------------- persistence and replay

@pytest.mark.parametrize("backend", ["memory", "file"])
def test_restart_after_a_fast_answer_replays_the_stored_bytes_and_refuses_everything_else(backend, tmp_path):
    from fedsbdt.common.secagg import FileStorage
    from .conftest import make_config

    storages = None
    if backend == "file":
        storages = {s: FileStorage(tmp_path / s) for s in make_config(4, 3).site_ids}
    fed = make_federation(4, 3, **({} if storages is None else {"storages": storages}))
    fed.run_epoch(3)
    rng = np.random.default_rng(11)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    rnd, start = fed.coordinator.begin_round(DIM, fast=True)
    first = fed.sites["site-02"].handle_round_start(start, xs["site-02"]).to_bytes()
    site = fed.restart_site("site-02")
    assert site.round_stage(start.round_id) == "answered-fast"
    other = random_inputs(fed.config.site_ids, DIM, rng)["site-02"]  # ignored: the stored reply is returned
    assert site.handle_round_start(start, other).to_bytes() == first
    # the same round id with the flag changed (and nothing else) is a changed RoundStart
    slow_twin = M.RoundStart(start.session_digest, start.epoch, start.round_id, start.vector_len, start.participants)
    with pytest.raises(ReplayError):
        site.handle_round_start(slow_twin, xs["site-02"])
    # consistency / unmask requests for a fast-answered round: refused, the abort persisted, nothing revealed
    creq = M.ConsistencyRequest(fed.config.digest, start.epoch, start.round_id, start.participants)
    ureq = M.UnmaskRequest(fed.config.digest, start.epoch, start.round_id, start.participants[1:],
                           start.participants[:1], ())
    before = {k: fed.storages["site-02"].get(k) for k in fed.storages["site-02"].keys()}
    with pytest.raises(ProtocolAbort, match="answered fast"):
        site.handle_consistency_request(creq)
    with pytest.raises(ProtocolAbort):
        site.handle_unmask_request(ureq)
    after = fed.storages["site-02"].keys()
    new = set(after) - set(before)
    assert len(new) == 1 and new.pop().endswith("/aborted")  # the only new record: the abort (no "signed"/"revealed")
    site = fed.restart_site("site-02")
    assert site.round_stage(start.round_id) == "aborted"
    for req in (creq, ureq):
        with pytest.raises(ProtocolAbort):
            site.handle(req)
    with pytest.raises(ReplayError):
        site.handle_round_start(start, xs["site-02"])
    # the coordinator still finalizes the round from the fast inputs (the others answer; site-02 answered before)
    rnd.receive(first)
    for s in start.participants:
        if s != "site-02":
            rnd.receive(fed.to_site(s, start, xs[s]))
    assert np.array_equal(rnd.finalize().total, plain_sum(xs, start.participants))
    # and the restarted site takes part in the next round normally
    xs2 = random_inputs(fed.config.site_ids, DIM, rng)
    assert np.array_equal(fed.run_round(xs2, DIM, fast=True).total, plain_sum(xs2, fed.config.site_ids))


@pytest.mark.parametrize("stage", ["input-sent", "signed", "revealed", "aborted"])
def test_a_site_on_the_signed_path_refuses_a_fast_round_start_for_the_same_round(stage):
    """RoundStart comes first, so the only real orderings are: the slow RoundStart (then maybe the consistency
    and unmask requests, or an abort) and *afterwards* a fast RoundStart for the same round: always refused,
    and the site's state (and what it revealed) is unchanged."""
    fed = ready(5, 3)
    rng = np.random.default_rng(12)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    ids = fed.config.site_ids
    _, start = fed.coordinator.begin_round(DIM)
    ys = {s: fed.sites[s].handle_round_start(start, xs[s]) for s in ids}
    creq = M.ConsistencyRequest(fed.config.digest, start.epoch, start.round_id, ids if stage != "aborted" else ids[1:])
    if stage in ("signed", "revealed"):
        sigs = {s: fed.sites[s].handle_consistency_request(creq).signature for s in ids}
        if stage == "revealed":
            ureq = M.UnmaskRequest(fed.config.digest, start.epoch, start.round_id, ids, (), tuple(sorted(sigs.items())))
            fed.sites["site-00"].handle_unmask_request(ureq)
    elif stage == "aborted":
        with pytest.raises(ProtocolAbort):  # the survivor set omits site-00
            fed.sites["site-00"].handle_consistency_request(creq)
    site = fed.sites["site-00"]
    assert site.round_stage(start.round_id) == stage
    fast = FastRoundStart(start.session_digest, start.epoch, start.round_id, start.vector_len, start.participants)
    keys = {k: site._storage.get(k) for k in site._storage.keys()}
    with pytest.raises(ReplayError):
        site.handle_round_start(fast, xs["site-00"])
    assert {k: site._storage.get(k) for k in site._storage.keys()} == keys
    assert site.round_stage(start.round_id) == stage
    if stage == "input-sent":  # the identical slow RoundStart still gets its stored input
        assert site.handle_round_start(start, xs["site-00"]) == ys["site-00"]


def test_a_later_round_closes_a_fast_round_like_any_other():
    fed = ready(4, 3)
    rng = np.random.default_rng(13)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    _, start = fed.coordinator.begin_round(DIM, fast=True)
    fed.sites["site-00"].handle_round_start(start, xs["site-00"])
    fed.run_round(xs, DIM)  # the next round id
    with pytest.raises(ReplayError):
        fed.sites["site-00"].handle_round_start(start, xs["site-00"])
    assert fed.sites["site-00"].round_stage(start.round_id) is None


# --------------------------------------------------------------------------- refusals

def test_fast_round_with_one_input_missing_aborts_and_releases_nothing():
    fed = ready(5, 3)
    rng = np.random.default_rng(14)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    rnd, start = fed.coordinator.begin_round(DIM, fast=True)
    for s in start.participants:
        if s != "site-03":
            rnd.receive(fed.to_site(s, start, xs[s]))
    assert rnd.awaiting() == ("site-03",)
    with pytest.raises(ProtocolAbort, match="site-03"):
        rnd.finalize()
    assert rnd.stage.name == "failed"
    with pytest.raises(OutOfOrder):
        rnd.finalize()
    with pytest.raises(OutOfOrder):  # too late: the late input is not accepted any more
        rnd.receive(fed.to_site("site-03", start, xs["site-03"]))
    # no honest site that answered fast reveals site-03's mask key (or anything) to a signed-path request
    ids = start.participants
    ureq = M.UnmaskRequest(fed.config.digest, start.epoch, start.round_id, tuple(s for s in ids if s != "site-03"),
                           ("site-03",), ())
    for s in ids:
        with pytest.raises(ProtocolAbort):
            fed.sites[s].handle_unmask_request(ureq)
    # the caller retries in a new round (new id), which succeeds
    res = fed.run_round(xs, DIM, fast=True)
    assert res.round_id == start.round_id + 1 and np.array_equal(res.total, plain_sum(xs, ids))


def test_min_survivors_applies_to_p_r_in_a_fast_round():
    fed = ready(6, 4)
    rule = lambda start: 5  # noqa: E731 - the federation's k_r + c, here a constant
    from fedsbdt.common.secagg import SecAggSite

    site = SecAggSite(fed.config, "site-00", fed.identities["site-00"], fed.storages["site-00"], min_survivors=rule)
    rng = np.random.default_rng(15)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    small = fed.config.site_ids[:4]  # ≥ t, but below the site's rule
    _, start = fed.coordinator.begin_round(DIM, small, fast=True)
    with pytest.raises(ProtocolAbort, match="at least 5"):
        site.handle_round_start(start, xs["site-00"])
    assert site.round_stage(start.round_id) == "aborted"
    site = SecAggSite(fed.config, "site-00", fed.identities["site-00"], fed.storages["site-00"], min_survivors=rule)
    assert site.round_stage(start.round_id) == "aborted"  # persisted like other aborts
    _, start = fed.coordinator.begin_round(DIM, fed.config.site_ids[:5], fast=True)
    assert isinstance(site.handle_round_start(start, xs["site-00"]), FastMaskedInput)


def test_fast_rounds_are_refused_on_a_sparse_graph_at_both_ends():
    fed = make_federation(10, config_kw={"graph": "sparse", "neighbours": 4})
    fed.run_epoch(3)
    before = fed.coordinator.slots_remaining()
    with pytest.raises(ConfigError, match="sparse"):
        fed.coordinator.begin_round(DIM, fast=True)
    assert fed.coordinator.slots_remaining() == before  # no round id was used
    _, start = fed.coordinator.begin_round(DIM)
    fast = FastRoundStart(start.session_digest, start.epoch, start.round_id, start.vector_len, start.participants)
    rng = np.random.default_rng(16)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    with pytest.raises(ProtocolAbort, match="sparse"):
        fed.sites["site-00"].handle_round_start(fast, xs["site-00"])
    assert fed.sites["site-00"].round_stage(start.round_id) == "aborted"


def test_a_site_with_fast_rounds_disabled_refuses_them_and_still_runs_slow_rounds():
    from fedsbdt.common.secagg import SecAggSite

    fed = ready(4, 3)
    fed.sites["site-01"] = SecAggSite(fed.config, "site-01", fed.identities["site-01"], fed.storages["site-01"],
                                      allow_fast=False)
    rng = np.random.default_rng(17)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    rnd, start = fed.coordinator.begin_round(DIM, fast=True)
    with pytest.raises(ProtocolAbort, match="fast rounds are disabled by this site's plan"):
        fed.to_site("site-01", start, xs["site-01"])
    assert fed.sites["site-01"].round_stage(start.round_id) == "aborted"
    res = fed.run_round(xs, DIM)  # the retry on the signed path
    assert np.array_equal(res.total, plain_sum(xs, fed.config.site_ids))


# --------------------------------------------------------------------------- bad shares

def _tamper(reply: FastMaskedInput, dealer: str) -> FastMaskedInput:
    """Shift the sender's share of ``dealer``'s seed by a sender-specific amount (equal shifts of several
    holders could cancel in the Lagrange sum and leave the secret right, which is harmless but not a test)."""
    from fedsbdt.common.secagg.shamir import PRIME

    delta = 7 ** (1 + int(reply.sender.split("-")[1]))
    shares = tuple((d, ((int.from_bytes(s, "big") + delta) % PRIME).to_bytes(33, "big") if d == dealer else s)
                   for d, s in reply.seed_shares)
    return FastMaskedInput(reply.session_digest, reply.epoch, reply.round_id, reply.sender, reply.masked, shares)


@pytest.mark.parametrize("wire", [False, True], ids=["objects", "bytes"])  # bytes: the bulk-decoded replies
@pytest.mark.parametrize("liars", [1, 2, 3])
def test_bad_seed_shares_in_fast_replies_are_blamed_and_survived_or_abort(liars, wire):
    n, t = 5, 3
    fed = ready(n, t)
    rng = np.random.default_rng(18 + liars)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    rnd, start = fed.coordinator.begin_round(DIM, fast=True)
    bad = set(start.participants[:liars])  # the first holders: their shares are the ones interpolated first
    for s in start.participants:
        reply = fed.to_site(s, start, xs[s])
        msg = _tamper(reply, "site-04") if s in bad else reply
        rnd.receive(msg.to_bytes() if wire else msg)
    if n - liars >= t:
        res = rnd.finalize()
        assert res.blamed == tuple(sorted(bad))
        assert np.array_equal(res.total, plain_sum(xs, start.participants))
    else:
        with pytest.raises(ProtocolAbort) as exc:
            rnd.finalize()
        assert set(exc.value.blame) == bad
        assert rnd.stage.name == "failed"


def test_fast_reply_must_carry_seed_shares_for_exactly_the_participants():
    fed = ready(4, 3)
    rng = np.random.default_rng(19)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    rnd, start = fed.coordinator.begin_round(DIM, fast=True)
    reply = fed.to_site("site-00", start, xs["site-00"])
    short = FastMaskedInput(reply.session_digest, reply.epoch, reply.round_id, reply.sender, reply.masked,
                            reply.seed_shares[1:])
    wrong_len = FastMaskedInput(reply.session_digest, reply.epoch, reply.round_id, reply.sender, reply.masked[1:],
                                reply.seed_shares)
    for msg in (short, wrong_len):
        with pytest.raises(InvalidMessage):
            rnd.receive(msg)
    rnd.receive(reply)
    with pytest.raises(InvalidMessage, match="two different"):
        rnd.receive(_tamper(reply, "site-01"))
    assert rnd.survivors == ("site-00",)


# --------------------------------------------------------------------------- the mixed-path attack

ROLES = ("fast", "all", "minus")  # fast path; signed path with U3 = P_r ∋ victim; signed path with U3' = P_r ∖ {victim}
#: (n, t, c) with c at the bound 2t = n + c + 1: one colluder more breaks 2t > n + c
AT_THE_BOUND = [(3, 2, 0), (4, 3, 1), (5, 3, 0), (5, 4, 2), (6, 4, 1)]


def _colluder_share(fed, ep, colluder: str, victim: str, start, kind: int) -> bytes:
    """A colluder's stored share of the victim's secret (the attacker holds the colluders' storage)."""
    from fedsbdt.common.secagg.records import EpochReadyRecord, epoch_key

    held = dict(EpochReadyRecord.from_bytes(fed.storages[colluder].get(epoch_key(start.epoch, "ready"))).held)
    slot = start.round_id - ep.announce.first_round
    off = (2 * slot + kind) * 33
    return held[victim][off:off + 33]


def mixed_attack(fed, ep, colluders: tuple[str, ...], roles: dict[str, str], rng) -> dict:
    """One round of a coordinator that shows the fast path to some honest sites and the signed path (with a
    survivor set that keeps or drops the victim site-00) to others; colluders sign anything and hand over
    their stored shares.  Returns what it obtained; asserts x_victim exactly whenever it has both secrets."""
    from fedsbdt.common.fixedpoint import from_ring
    from fedsbdt.common.secagg import SecAggError, shamir
    from fedsbdt.common.secagg import primitives as P
    from .conftest import identities

    cfg, ids, t = fed.config, fed.config.site_ids, fed.config.threshold
    victim = ids[0]
    honest = [s for s in ids if s not in colluders]
    xs = random_inputs(ids, DIM, rng)
    _, start = fed.coordinator.begin_round(DIM)  # allocates the round id; the messages below are the attacker's
    fast = FastRoundStart(start.session_digest, start.epoch, start.round_id, DIM, start.participants)
    assert start.epoch == ep.epoch
    seed_pts = {c: _colluder_share(fed, ep, c, victim, start, M.KIND_SEED) for c in colluders}
    key_pts = {c: _colluder_share(fed, ep, c, victim, start, M.KIND_KEY) for c in colluders}
    y_victim = None
    for s in honest:  # phase 1: each honest site is shown one path
        reply = fed.sites[s].handle_round_start(fast if roles[s] == "fast" else start, xs[s])
        if s == victim:
            y_victim = reply.masked
        if roles[s] == "fast":
            seed_pts[s] = dict(reply.seed_shares)[victim]
    requests, opened_sets = [], {}
    for role, u3 in (("all", ids), ("minus", ids[1:])):
        payload = M.consistency_payload(cfg.digest, start.epoch, ep.epoch_digest, start.round_id, DIM, ids, u3)
        sigs = {c: P.ed25519_sign(identities(len(ids))[c], M.CONSISTENCY_DOMAIN, payload) for c in colluders}
        creq = M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, u3)
        group = [s for s in honest if roles[s] == role]
        for s in group:
            try:
                sigs[s] = fed.sites[s].handle_consistency_request(creq).signature
            except ProtocolAbort:
                assert s == victim and role == "minus"  # the victim refuses a set without itself
        ureq = M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, u3,
                               tuple(x for x in ids if x not in u3), tuple(sorted(sigs.items())))
        revealed = []
        for s in group:
            try:
                resp = fed.sites[s].handle_unmask_request(ureq)
            except ProtocolAbort:
                continue  # fewer than t signatures (or the victim, aborted above)
            revealed.append(s)
            seed_pts.update({s: v for d, v in resp.seed_shares if d == victim})
            key_pts.update({s: v for d, v in resp.key_shares if d == victim})
        opened_sets[role] = bool(revealed)
        requests += [creq, ureq]
    for s in honest:  # phase 2: every other request to every honest site is refused, revealing nothing
        mine = {"fast": (), "all": requests[:2], "minus": requests[2:]}[roles[s]]
        other_start = start if roles[s] == "fast" else fast
        with pytest.raises(ReplayError):
            fed.sites[s].handle_round_start(other_start, xs[s])
        for req in requests:
            if req not in mine:
                with pytest.raises(SecAggError):
                    fed.sites[s].handle(req)
    out = {"seed": len(seed_pts), "key": len(key_pts), "opened_sets": opened_sets, "x": False}
    if len(seed_pts) >= t and len(key_pts) >= t:
        pts = lambda d: [(cfg.x_coordinate(h), int.from_bytes(v, "big")) for h, v in d.items()]  # noqa: E731
        seed = shamir.int_to_secret(shamir.reconstruct(pts(seed_pts), t))
        sk = shamir.int_to_secret(shamir.reconstruct(pts(key_pts), t))
        slot = start.round_id - ep.announce.first_round
        total = y_victim.copy()
        total -= P.prg_expand(P.self_mask_key(seed, cfg.digest, start.epoch, start.round_id, victim, DIM), DIM)
        for v in ids[1:]:
            m = P.prg_expand(P.pair_mask_key(P.x25519_agree(sk, ep.mask_keys[v][slot]), cfg.digest, start.epoch,
                                             start.round_id, victim, v, DIM), DIM)
            total = total - m if victim < v else total + m
        assert np.array_equal(from_ring(total), xs[victim])  # both secrets: the victim's exact input
        out["x"] = True
    return out


def _model(roles, colluders: int, t: int, victim: str) -> dict:
    """Independent count: who reveals what (honest sites take one action; signed paths need t signatures)."""
    f = sum(r == "fast" for r in roles.values())
    a = sum(r == "all" for r in roles.values())
    b = sum(r == "minus" for s, r in roles.items() if s != victim)
    all_open, minus_open = a + colluders >= t, b + colluders >= t
    seed = f + (a if all_open else 0) + colluders
    key = (b if minus_open else 0) + colluders
    return {"seed": seed, "key": key, "x": seed >= t and key >= t,
            "opened_sets": {"all": all_open, "minus": minus_open}, "fast_complete": f + colluders >= t}


@pytest.mark.parametrize("n,t,c", AT_THE_BOUND)
def test_mixed_fast_and_signed_paths_never_open_a_site_at_the_collusion_bound(n, t, c):
    """Every split of the honest sites into {fast, signed with U3 ∋ v, signed with U3' ∌ v}: with c colluders
    the coordinator never holds both b_v and v's round key, and at most one sum can be unmasked per round;
    with c + 1 colluders (the negative control) some split opens x_v exactly — where the count says."""
    import itertools

    assert 2 * t == n + c + 1
    ids = make_federation(n, t).config.site_ids
    splits = {k: list(itertools.product(ROLES, repeat=n - k)) for k in (c, c + 1)}
    fed = make_federation(n, t, config_kw={"assumed_colluders": c, "max_epoch_rounds": 512})
    ep = fed.run_epoch(sum(map(len, splits.values())))
    rng = np.random.default_rng(n * 100 + c)
    for k in (c, c + 1):
        colluders = ids[n - k:]
        honest = ids[: n - k]
        opened = 0
        for split in splits[k]:
            roles = dict(zip(honest, split))
            got, want = mixed_attack(fed, ep, colluders, roles, rng), _model(roles, k, t, ids[0])
            assert {key: got[key] for key in ("seed", "key", "x", "opened_sets")} == \
                {key: want[key] for key in ("seed", "key", "x", "opened_sets")}, roles
            if k == c:
                assert not got["x"], f"the victim's input was opened with {c} colluders: {roles}"
                # at most ONE sum per round: the fast sum over P_r or the sum over one U3 with t signatures
                assert want["fast_complete"] + sum(got["opened_sets"].values()) <= 1, roles
            opened += got["x"]
        if k == c + 1:
            assert opened > 0, "negative control: one colluder above the bound must open the victim's input"


def test_an_input_record_pairing_a_slow_start_with_a_fast_reply_is_refused_as_corrupt():
    from fedsbdt.common.secagg import SecAggSite, StorageError
    from fedsbdt.common.secagg.records import RoundInputRecord, round_key

    fed = ready(3, 2)
    rng = np.random.default_rng(20)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    _, start = fed.coordinator.begin_round(DIM, fast=True)
    reply = fed.sites["site-00"].handle_round_start(start, xs["site-00"])
    store = fed.storages["site-00"]
    assert RoundInputRecord.from_bytes(store.get(round_key(start.round_id, "input"))).response == reply
    slow = M.RoundStart(start.session_digest, start.epoch, start.round_id, start.vector_len, start.participants)
    store.put(round_key(start.round_id, "input"), RoundInputRecord(slow, reply).to_bytes())
    with pytest.raises(StorageError, match="does not answer"):
        SecAggSite(fed.config, "site-00", fed.identities["site-00"], store)
