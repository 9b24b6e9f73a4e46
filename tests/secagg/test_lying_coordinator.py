"""A coordinator that lies: marks a live site dead, lists a site both alive and dead, sends
different survivor sets to different sites, or runs a round with too small a participant set."""
from __future__ import annotations


import numpy as np
import pytest

from fedsbdt.common.fixedpoint import from_ring
from fedsbdt.common.secagg import InvalidMessage, ProtocolAbort, ReplayError
from fedsbdt.common.secagg import messages as M
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg import shamir

from .conftest import make_federation, random_inputs

DIM = 6


def setup(n=5, t=3, e=3):
    fed = make_federation(n, t)
    fed.run_epoch(e)
    return fed


def collect_inputs(fed, start, xs, sites=None):
    return {s: fed.sites[s].handle_round_start(start, xs[s]) for s in (sites or start.participants)}


def sign(fed, start, survivors, signers):
    req = M.ConsistencyRequest(fed.config.digest, start.epoch, start.round_id, tuple(survivors))
    return {s: fed.sites[s].handle_consistency_request(req).signature for s in signers}


def unmask_req(fed, start, survivors, dropped, sigs):
    return M.UnmaskRequest(
        fed.config.digest, start.epoch, start.round_id, tuple(survivors), tuple(dropped), tuple(sorted(sigs.items()))
    )


def audit(responses):
    """(dealer → kinds revealed) across every response the coordinator obtained."""
    kinds: dict[str, set[str]] = {}
    for r in responses:
        for d, _ in r.seed_shares:
            kinds.setdefault(d, set()).add("seed")
        for d, _ in r.key_shares:
            kinds.setdefault(d, set()).add("key")
    return kinds


def test_live_site_marked_dead_keeps_its_input_hidden():
    """The coordinator holds site-04's masked input but declares it dropped.  Sites reveal
    site-04's mask key (so all pair masks can be removed) but never its self-mask seed:
    the input stays hidden under PRG(b).  site-04 itself refuses to sign a set without it."""
    fed = setup()
    rng = np.random.default_rng(0)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    _, start = fed.coordinator.begin_round(DIM)
    ys = collect_inputs(fed, start, xs)
    victim = "site-04"
    u3 = tuple(s for s in start.participants if s != victim)
    with pytest.raises(ProtocolAbort, match="omits this site"):
        fed.sites[victim].handle_consistency_request(M.ConsistencyRequest(fed.config.digest, start.epoch, start.round_id, u3))
    sigs = sign(fed, start, u3, u3)
    req = unmask_req(fed, start, u3, (victim,), sigs)
    responses = [fed.sites[s].handle_unmask_request(req) for s in u3]
    kinds = audit(responses)
    assert kinds[victim] == {"key"}
    # The coordinator now reconstructs site-04's round mask key and strips every pair mask …
    slot = start.round_id - fed.coordinator.epoch(start.epoch).announce.first_round
    pts = [(fed.config.x_coordinate(r.sender), int.from_bytes(dict(r.key_shares)[victim], "big")) for r in responses]
    sk = shamir.int_to_secret(shamir.reconstruct(pts, fed.config.threshold))
    ep = fed.coordinator.epoch(start.epoch)
    assert P.x25519_public(sk) == ep.mask_keys[victim][slot]
    stripped = ys[victim].masked.copy()
    for v in u3:
        s = P.x25519_agree(sk, ep.mask_keys[v][slot])
        m = P.prg_expand(P.pair_mask_key(s, fed.config.digest, start.epoch, start.round_id, victim, v, DIM), DIM)
        stripped = stripped - m if victim < v else stripped + m
    # … but what is left is x + PRG(b), not x
    assert not np.array_equal(from_ring(stripped), xs[victim])
    seed = fed.sites[victim]._epochs[start.epoch].secrets.seeds[slot]
    self_mask = P.prg_expand(P.self_mask_key(seed, fed.config.digest, start.epoch, start.round_id, victim, DIM), DIM)
    assert np.array_equal(from_ring(stripped - self_mask), xs[victim])  # (sanity: only b was missing)


def test_site_listed_alive_and_dead_is_refused():
    fed = setup()
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(1))
    _, start = fed.coordinator.begin_round(DIM)
    collect_inputs(fed, start, xs)
    u3 = start.participants
    sigs = sign(fed, start, u3, u3)
    for s in u3:
        with pytest.raises(ProtocolAbort, match="both alive and dropped"):
            fed.sites[s].handle_unmask_request(unmask_req(fed, start, u3, ("site-02",), sigs))
        assert fed.sites[s].round_stage(start.round_id) == "aborted"
    # after the abort no request, not even an honest one, gets anything for this round
    with pytest.raises(ProtocolAbort):
        fed.sites["site-00"].handle_unmask_request(unmask_req(fed, start, u3, (), sigs))


def test_unmask_request_must_partition_participants_and_match_signed_set():
    fed = setup()
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(2))
    _, start = fed.coordinator.begin_round(DIM)
    collect_inputs(fed, start, xs)
    u3 = ("site-00", "site-01", "site-02", "site-03")
    sigs = sign(fed, start, u3, u3)
    with pytest.raises(ProtocolAbort, match="partition"):  # site-04 silently omitted from both lists
        fed.sites["site-00"].handle_unmask_request(unmask_req(fed, start, u3, (), sigs))
    with pytest.raises(ProtocolAbort, match="different from the one this site signed"):
        fed.sites["site-01"].handle_unmask_request(unmask_req(fed, start, u3[:3], ("site-03", "site-04"), sigs))


def test_different_survivor_sets_to_different_sites_never_yield_both_shares():
    """Group A is told U3a = all but site-04, group B is told U3b = all but site-03.  Revealing
    for both would give the coordinator site-03's seed *and* mask key.  With 2t > n at most one
    set can gather t signatures; the other is refused however the signatures are combined."""
    fed = setup(n=5, t=3)
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(3))
    _, start = fed.coordinator.begin_round(DIM)
    collect_inputs(fed, start, xs)
    u3a = ("site-00", "site-01", "site-02", "site-03")
    u3b = ("site-00", "site-01", "site-02", "site-04")
    sigs_a = sign(fed, start, u3a, ("site-00", "site-01", "site-03"))
    sigs_b = sign(fed, start, u3b, ("site-02", "site-04"))
    # a site that signed one set refuses to sign the other
    with pytest.raises(ReplayError, match="different survivor set"):
        sign(fed, start, u3b, ("site-00",))
    responses = [fed.sites[s].handle_unmask_request(unmask_req(fed, start, u3a, ("site-04",), sigs_a)) for s in sigs_a]
    # forged combinations are refused without changing state …
    forged = [
        {**sigs_b, "site-00": sigs_a["site-00"]},  # a U3a signature presented as one on U3b
        {**sigs_b, "site-01": sigs_a["site-01"], "site-00": sigs_a["site-00"]},
    ]
    for sigs in forged:
        for s in ("site-02", "site-04"):
            with pytest.raises(InvalidMessage, match="invalid consistency signature"):
                fed.sites[s].handle_unmask_request(unmask_req(fed, start, u3b, ("site-03",), sigs))
            assert fed.sites[s].round_stage(start.round_id) == "signed"
    # … and the genuine but insufficient or mismatched sets abort the round at the site, durably
    with pytest.raises(ProtocolAbort, match="only 2 consistency signatures"):
        fed.sites["site-02"].handle_unmask_request(unmask_req(fed, start, u3b, ("site-03",), sigs_b))
    with pytest.raises(ProtocolAbort, match="different from the one this site signed"):
        fed.sites["site-04"].handle_unmask_request(unmask_req(fed, start, u3a, ("site-04",), sigs_a))
    for s in ("site-02", "site-04"):
        fed.restart_site(s)
        assert fed.sites[s].round_stage(start.round_id) == "aborted"
        for surv, drop, sigs in ((u3a, ("site-04",), sigs_a), (u3b, ("site-03",), sigs_b)):
            with pytest.raises(ProtocolAbort, match="was aborted"):
                fed.sites[s].handle_unmask_request(unmask_req(fed, start, surv, drop, sigs))
    kinds = audit(responses)
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert kinds["site-03"] == {"seed"} and kinds["site-04"] == {"key"}


def test_participant_set_checks():
    fed = setup(n=5, t=3, e=6)
    digest = fed.config.digest
    x = np.zeros(DIM, dtype=np.int64)
    site = fed.sites["site-00"]
    bad = [
        (("site-00", "site-01"), "only 2 participants"),
        (("site-01", "site-02", "site-03"), "does not include this site"),
        (("site-00", "site-01", "site-99"), "did not complete"),
    ]
    for r, (participants, msg) in enumerate(bad):
        with pytest.raises(ProtocolAbort, match=msg):
            site.handle_round_start(M.RoundStart(digest, 0, r, DIM, participants), x)
        assert site.round_stage(r) == "aborted"
    good = M.RoundStart(digest, 0, 2, DIM, ("site-00", "site-01", "site-02"))
    # an aborted round is burnt at this site: not even a valid participant set is accepted for it
    with pytest.raises(ReplayError, match="was aborted"):
        site.handle_round_start(good, x)
    fed.restart_site("site-00")  # durably
    with pytest.raises(ReplayError, match="was aborted"):
        fed.sites["site-00"].handle_round_start(good, x)
    fed.sites["site-01"].handle_round_start(good, x)
    assert fed.sites["site-01"].round_stage(2) == "input-sent"
    # the retry takes a new slot
    fed.sites["site-00"].handle_round_start(M.RoundStart(digest, 0, 3, DIM, good.participants), x)
    assert fed.sites["site-00"].round_stage(3) == "input-sent"


def test_consistency_request_checks():
    fed = setup(n=5, t=3)
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(4))
    _, start = fed.coordinator.begin_round(DIM, participants=("site-00", "site-01", "site-02", "site-03"))
    collect_inputs(fed, start, xs)
    d = fed.config.digest
    site = fed.sites["site-00"]
    with pytest.raises(ProtocolAbort, match="non-participants"):
        site.handle_consistency_request(M.ConsistencyRequest(d, 0, start.round_id, ("site-00", "site-01", "site-04")))
    site = fed.sites["site-01"]
    with pytest.raises(ProtocolAbort, match="only 2 survivors"):
        site.handle_consistency_request(M.ConsistencyRequest(d, 0, start.round_id, ("site-00", "site-01")))
