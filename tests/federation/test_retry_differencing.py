"""Retry differencing (issue 10, attack 3), performed against the real site state machines.

A malicious coordinator runs a logical round (the initial score, or tree k)
with P = {a, b, c}, unmasks the sum and withholds it, then "retries" the same
logical round with P = {a, b} and unmasks again.  In central noise mode the
sites add no noise, so on the unfixed code the difference of the two sums is
site c's exact [record count, label sum] (or, without subsampling, its exact
leaf sums).  The fix: a site's un-noised vector enters at most one attempt of
a logical round; every later attempt carries a full noise share of its own
(client/site.py), so the difference is noised.  The coordinator here is a
bare secure-aggregation coordinator driven by hand: it follows the protocol
message by message but chooses participant sets and results as it likes.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.fixedpoint import from_ring
from fedsbdt.common.secagg import SecAggCoordinator, decode_message
from fedsbdt.common.federation.wire import InitScoreMsg, InputReply, Purpose, RoundMsg, RoundReply, RoundStartMsg, SetupMsg, SetupReply

from .test_state_machines import SITES, Fed, tree_hp

A, B, C = SITES


def _setup_epoch(f: Fed, rounds: int = 8) -> SecAggCoordinator:
    coord = SecAggCoordinator(f.plan.secagg_config())
    setup, ann = coord.begin_epoch(rounds)

    def ask(site, msg):
        (reply,) = f.machines[site].handle(SetupMsg(msg.to_bytes()))
        assert isinstance(reply, SetupReply), reply
        return decode_message(reply.secagg)

    for s in SITES:
        setup.receive_advertise(ask(s, ann))
    roster = setup.close_advertise()
    for s in SITES:
        setup.receive_share_keys(ask(s, roster))
    for s, msg in setup.close_share_keys().items():
        assert f.machines[s].handle(SetupMsg(msg.to_bytes())) == []
    return coord


def _unmasked_sum(f: Fed, coord: SecAggCoordinator, purpose: Purpose, tree: int, participants) -> np.ndarray:
    """One honest-looking attempt with the coordinator's chosen participants; returns the exact sum."""
    d = 2 if purpose == Purpose.INIT_SCORE else 2 * f.plan.hyperparameters.leaves
    rnd, start = coord.begin_round(d, tuple(sorted(participants)))
    for s in start.participants:
        (reply,) = f.machines[s].handle(RoundStartMsg(purpose, tree, start.to_bytes()))
        assert isinstance(reply, InputReply), reply
        rnd.receive(reply.secagg)
    for stage in (rnd.close_inputs, rnd.close_consistency):
        req = stage()
        for s in (req.survivors if hasattr(req, "survivors") and not hasattr(req, "signatures")
                  else [x for x, _ in req.signatures]):
            (reply,) = f.machines[s].handle(RoundMsg(req.to_bytes()))
            assert isinstance(reply, RoundReply), reply
            rnd.receive(reply.secagg)
    return np.asarray(from_ring(rnd.finalize().total), dtype=np.int64)


def test_central_initial_score_retry_does_not_reveal_one_sites_count_and_label_sum(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=1), noise="central", test_noise=True)
    coord = _setup_epoch(f)
    withheld = _unmasked_sum(f, coord, Purpose.INIT_SCORE, 0, SITES)
    x_c = f.machines[C].ledger.init_vector()[0]  # site c's exact [record count, label sum]
    assert x_c[0] > 0
    assert np.array_equal(withheld, sum(f.machines[s].ledger.init_vector()[0] for s in SITES))  # un-noised once
    retries = [_unmasked_sum(f, coord, Purpose.INIT_SCORE, 0, (A, B)) for _ in range(3)]
    difference = withheld - retries[0]
    assert not np.array_equal(difference, x_c), "the retry revealed site c's exact count and label sum"
    # every retry resends the identical noisy vector: averaging retries does not remove the noise
    assert all(np.array_equal(r, retries[0]) for r in retries)
    for s in (A, B):
        noise = f.machines[s].ledger.init_retry_noise()
        assert noise is not None and np.all(noise != 0)
    assert np.array_equal(difference, x_c - f.machines[A].ledger.init_retry_noise()
                          - f.machines[B].ledger.init_retry_noise())


def test_central_tree_retry_does_not_reveal_one_sites_leaf_sums(tmp_path):
    # γ = 1 and no filter: a site's leaf sums are the same in every attempt, the worst case for differencing
    hp = tree_hp(trees=2, subsample=1.0, init_share=0.0)
    f = Fed(tmp_path, hp, noise="central", test_noise=True)
    coord = _setup_epoch(f)
    sums = {}
    for s in SITES:  # record each site's exact (un-noised) contribution as it is computed
        m, contribution = f.machines[s], f.machines[s].local.contribution

        def recording(*a, contribution=contribution, s=s, **k):
            c = contribution(*a, **k)
            sums.setdefault(s, []).append(c.sums.copy())
            return c

        m.local.contribution = recording
    withheld = _unmasked_sum(f, coord, Purpose.TREE, 0, SITES)
    assert np.array_equal(withheld, sum(sums[s][0] for s in SITES))  # the first attempt: un-noised sums
    retry = _unmasked_sum(f, coord, Purpose.TREE, 0, (A, B))
    assert all(np.array_equal(sums[s][1], sums[s][0]) for s in (A, B))  # same data in both attempts …
    assert np.any(sums[C][0] != 0)
    assert not np.array_equal(withheld - retry, sums[C][0]), "the retry revealed site c's exact leaf sums"
    # … and the retry carried a full noise share per site: the difference misses c's sums by a sum of
    # two shares whose scale is the whole leaf noise (the coordinator's, not a fraction of it)
    scales = f.plan.central_retry_noise_scales()[0]
    off = (withheld - retry) - sums[C][0]
    assert np.all(np.abs(off) < 12 * np.sqrt(2) * scales)
    assert np.mean(np.abs(off) > 0.05 * scales) > 0.8
    for s in (A, B):
        assert f.machines[s].ledger.tree_attempts(0) == 2


def test_distributed_mode_retries_never_isolate_an_un_noised_vector(tmp_path):
    """Distributed mode needs no extra rule: every masked input carries the site's own share (stored and
    resent for the initial score, fresh per tree attempt and charged), so the same withhold-and-retry
    difference is site c's vector plus noise, for both kinds of round."""
    hp = tree_hp(trees=2, subsample=1.0)
    f = Fed(tmp_path, hp, test_noise=True)
    coord = _setup_epoch(f)
    withheld = _unmasked_sum(f, coord, Purpose.INIT_SCORE, 0, SITES)
    retry = _unmasked_sum(f, coord, Purpose.INIT_SCORE, 0, (A, B))
    x_c, noise_c = f.machines[C].ledger.init_vector()
    assert np.all(noise_c != 0)
    assert np.array_equal(withheld - retry, x_c + noise_c)  # c's ε-DP release, never x_c alone
    for m in f.machines.values():
        m.handle(InitScoreMsg(0.0, None, tuple(SITES)))
    sums = {}
    for s in SITES:
        m, contribution = f.machines[s], f.machines[s].local.contribution

        def recording(*a, contribution=contribution, s=s, **k):
            c = contribution(*a, **k)
            sums.setdefault(s, []).append(c.sums.copy())
            return c

        m.local.contribution = recording
    first = _unmasked_sum(f, coord, Purpose.TREE, 0, SITES)
    again = _unmasked_sum(f, coord, Purpose.TREE, 0, (A, B))
    assert all(np.array_equal(sums[s][1], sums[s][0]) for s in (A, B))
    assert not np.array_equal(first - again, sums[C][0])
    for s in (A, B):  # and both attempts were charged as contributions with data
        assert f.machines[s].ledger.tree_contributions() == 2
