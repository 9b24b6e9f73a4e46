"""Why fast rounds stay refused on the sparse graph (docs/secagg.md §10): with the refusal lifted, a
coordinator that mixes the fast and the signed path in one round opens an honest site's input with no
colluder at all.

The victim v is shown a participant set whose part in its neighbourhood is v and t_k − 1 honest neighbours W
(the local participation rule holds).  v and W answer fast, so t_k holders reveal their shares of v's seed.
Every other honest site is shown the signed path with W dropped; their neighbourhoods' signatures satisfy
every local rule, and W's neighbours reveal shares of W's mask keys.  With b_v and the keys of every
neighbour v masked with, y_v opens.  On the complete graph the same two reveals need t − c honest sites
each out of n − c (docs/secagg.md §6); on the graph they are counted in two different neighbourhoods, N[v]
and N[w], so nothing forbids both.  With the shipped refusal, v refuses the fast RoundStart and nothing opens.
"""
from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest

from fedsbdt.common.fixedpoint import from_ring
from fedsbdt.common.secagg import InvalidMessage, ProtocolAbort, SecAggSite
from fedsbdt.common.secagg import messages as M
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg import shamir

from .conftest import identities, random_inputs
from .test_sparse_graph import DIM, sparse_federation

N, K = 12, 4


def mixed_attack(fed, ep, victim: str, w_set: tuple[str, ...]) -> bool:
    """True iff the mixed fast/signed round opens ``victim``'s exact input (no colluders)."""
    cfg, g = fed.config, ep.graph
    ids, tk = cfg.site_ids, g.threshold
    _, start = fed.coordinator.begin_round(DIM, fast=cfg.fast_only)  # a fresh round id; the messages below are forged
    xs = random_inputs(ids, DIM, np.random.default_rng(7))
    sites = {s: SecAggSite(cfg, s, identities(N)[s], copy.deepcopy(fed.storages[s]), allow_fast=True) for s in ids}

    def fast_start(participants):
        return M.FastRoundStart(cfg.digest, start.epoch, start.round_id, DIM, tuple(sorted(participants)))

    hidden = set(g.neighbours(victim)) - set(w_set)  # v's other neighbours: left out of v's view
    try:
        y_v = sites[victim].handle_round_start(fast_start(set(ids) - hidden), xs[victim])
        fast = [y_v] + [sites[w].handle_round_start(fast_start(ids), xs[w]) for w in w_set]
    except ProtocolAbort:
        return False
    signed = [s for s in ids if s != victim and s not in w_set]
    p_signed = tuple(s for s in ids if s != victim)  # W in P', missing from U3'
    rs = M.RoundStart(cfg.digest, start.epoch, start.round_id, DIM, p_signed)
    live = []
    for s in signed:
        try:
            sites[s].handle_round_start(rs, xs[s])
            live.append(s)
        except ProtocolAbort:
            pass
    u3 = tuple(sorted(live))
    creq = M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, u3)
    sigs = tuple(sorted((s, sites[s].handle_consistency_request(creq).signature) for s in u3))
    dropped = tuple(s for s in p_signed if s not in u3)
    ureq = M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, u3, dropped, sigs)
    reveals = []
    for s in u3:
        try:
            reveals.append(sites[s].handle_unmask_request(ureq))
        except (ProtocolAbort, InvalidMessage):
            pass
    x = cfg.x_coordinate
    seed_pts = [(x(m.sender), int.from_bytes(dict(m.seed_shares)[victim], "big"))
                for m in fast if victim in dict(m.seed_shares)]
    if len(seed_pts) < tk:
        return False
    seed = shamir.int_to_secret(shamir.reconstruct(seed_pts, tk))
    slot = start.round_id - ep.announce.first_round
    opened = y_v.masked.copy()
    opened -= P.prg_expand(P.self_mask_key(seed, cfg.digest, start.epoch, start.round_id, victim, DIM), DIM)
    for w in w_set:
        key_pts = [(x(m.sender), int.from_bytes(dict(m.key_shares)[w], "big"))
                   for m in reveals if w in dict(m.key_shares)]
        if len(key_pts) < tk:
            return False
        sk_w = shamir.int_to_secret(shamir.reconstruct(key_pts, tk))
        assert P.x25519_public(sk_w) == ep.mask_keys[w][slot]
        m = P.prg_expand(P.pair_mask_key(P.x25519_agree(sk_w, ep.mask_keys[victim][slot]), cfg.digest,
                                         start.epoch, start.round_id, victim, w, DIM), DIM)
        opened = opened - m if victim < w else opened + m
    assert np.array_equal(from_ring(opened), xs[victim])  # the exact input: the attack really opened it
    return True


@pytest.fixture(scope="module")
def epoch():
    # every mixed_attack call takes a fresh round id: the first test tries at most C(K, t_k − 1) subsets per
    # victim, for every victim, the second C(K, t_k − 1)
    fed = sparse_federation(N, K, c=0)
    return fed, fed.run_epoch((N + 1) * max(math.comb(K, j) for j in range(K + 1)))


def test_with_the_refusal_lifted_a_mixed_round_opens_an_input_without_colluders(epoch, monkeypatch):
    fed, ep = epoch
    monkeypatch.setattr(SecAggSite, "_fast_problem", lambda self, msg, epoch: None)
    g, tk = ep.graph, ep.graph.threshold
    tried = opened = 0
    for victim in fed.config.site_ids:  # on a few random graphs one victim's neighbourhoods cannot all sign
        for w_set in itertools.combinations(g.neighbours(victim), tk - 1):
            tried += 1
            opened += mixed_attack(fed, ep, victim, w_set)
            if opened:
                break
        if opened:
            break
    assert opened, f"none of {tried} (victim, neighbour subset) pairs opened an input"


def test_with_the_refusal_the_same_round_opens_nothing(epoch):
    fed, ep = epoch
    victim = fed.config.site_ids[0]
    for w_set in itertools.combinations(ep.graph.neighbours(victim), ep.graph.threshold - 1):
        assert not mixed_attack(fed, ep, victim, w_set)
