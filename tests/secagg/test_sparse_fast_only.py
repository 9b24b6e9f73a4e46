"""Fast-only sessions on the sparse graph (docs/secagg.md §10 "Fast-only sessions").

In a fast-only session every site refuses the signed path, so no mask-key share ever leaves a site.  A
coordinator may still show every honest site a different participant set.  The exhaustive test tries
every assignment of neighbourhood views to the sites of a small graph, runs the real sites, and lets an
attacker holding every reply try every set S of sites: Σ_{u∈S} x_u opens exactly when the model says —
every seed of S has t_k revealed shares and every pair mask inside S cancels (u and w each masked with
the other) — and never for fewer inputs than the local rule allows (no single input).  The negative
control: one colluder more than the plan assumes (a neighbour of the victim) opens the victim's input.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedsbdt.common.fixedpoint import to_ring
from fedsbdt.common.secagg import ConfigError, ProtocolAbort
from fedsbdt.common.secagg import messages as M
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg import shamir

from .conftest import make_config, make_federation, random_inputs

N, K, DIM = 5, 2, 3  # a 5-cycle: every site has two neighbours, t_k = 2


def _views(g, site):
    """Every view a coordinator may show a site: the set of its neighbours it is told take part."""
    nb = g.neighbours(site)
    return [frozenset(c) for j in range(len(nb) + 1) for c in itertools.combinations(nb, j)]


def _fast_only(n=N, k=K):
    fed = make_federation(n, config_kw={"graph": "sparse", "neighbours": k, "fast_only": True, "max_epoch_rounds": 2048})
    return fed


def _run(fed, ep, views: dict, xs: dict):
    """Start one round in which site u is shown the participants {u} ∪ views[u] ∪ (its non-neighbours);
    returns (the round's start, the replies of the sites that answered)."""
    cfg, g = fed.config, ep.graph
    _, start = fed.coordinator.begin_round(DIM, fast=True)  # a fresh round id; the starts below are forged
    replies = {}
    for u, view in views.items():
        p = tuple(sorted({u} | set(view) | (set(cfg.site_ids) - set(g.holders(u)))))
        try:
            replies[u] = fed.sites[u].handle_round_start(
                M.FastRoundStart(cfg.digest, start.epoch, start.round_id, DIM, p), xs[u])
        except ProtocolAbort:  # the local rule: fewer than t_k of its closed neighbourhood take part
            assert len(view) < g.threshold - 1
    return start, replies


def _self_mask(fed, start, u, seed):
    return P.prg_expand(P.self_mask_key(seed, fed.config.digest, start.epoch, start.round_id, u, DIM), DIM)


def _seeds(fed, ep, replies, extra_shares=()):
    """Each site's self-mask seed, where t_k holders of its neighbourhood revealed a share."""
    g, x = ep.graph, fed.config.x_coordinate
    out = {}
    for u in fed.config.site_ids:
        pts = [(x(h), int.from_bytes(dict(m.seed_shares)[u], "big")) for h, m in replies.items() if u in dict(m.seed_shares)]
        pts += [(x(h), int.from_bytes(s, "big")) for h, d, s in extra_shares if d == u]
        if len(pts) >= g.threshold:
            out[u] = shamir.int_to_secret(shamir.reconstruct(pts[: g.threshold], g.threshold))
    return out


@pytest.fixture(scope="module")
def cycle():
    fed = _fast_only()
    ep = fed.run_epoch(4**N + 4**(N - 1) + 4)  # a round slot per assignment of both tests, and a few
    return fed, ep


def test_every_view_assignment_opens_exactly_the_modelled_sums_and_never_one_input(cycle):
    fed, ep = cycle
    g, tk, ids = ep.graph, ep.graph.threshold, fed.config.site_ids
    assert (g.degree, tk) == (K, 2)
    xs = random_inputs(ids, DIM, np.random.default_rng(3))
    subsets = [S for j in range(1, N + 1) for S in itertools.combinations(ids, j)]
    tried = opened_any = 0
    for choice in itertools.product(*(_views(g, u) for u in ids)):
        views = dict(zip(ids, choice))
        start, replies = _run(fed, ep, views, xs)
        seeds = _seeds(fed, ep, replies)
        unmasked = {u: replies[u].masked - _self_mask(fed, start, u, seeds[u]) for u in seeds if u in replies}
        for S in subsets:
            got = all(u in unmasked for u in S) and np.array_equal(
                sum((unmasked[u] for u in S), np.zeros(DIM, np.uint64)), sum(to_ring(xs[u]) for u in S))
            model = all(u in replies and u in seeds for u in S) and \
                all(w in S and u in views[w] for u in S for w in views[u])
            assert got == model, (views, S)
            if got:  # the local rule: every member has t_k − 1 neighbours in S
                opened_any += 1
                assert all(len(set(g.neighbours(u)) & set(S)) >= tk - 1 for u in S), (views, S)
                assert len(S) >= tk
        tried += 1
    assert tried == math.prod(len(_views(g, u)) for u in ids) == 4**N
    assert opened_any > 0  # the honest case (everyone sees everyone) opens the full sum


def test_negative_control_one_colluder_more_opens_the_victims_input(cycle):
    """A neighbour of the victim colludes (the plan assumed c = 0): its held share of b_v and its mask key
    open x_v once v is shown only that neighbour — some assignment must do it, and only such ones."""
    fed, ep = cycle
    g, ids = ep.graph, fed.config.site_ids
    victim = ids[0]
    col = g.neighbours(victim)[0]
    honest = [u for u in ids if u != col]
    xs = random_inputs(ids, DIM, np.random.default_rng(4))
    col_epoch = fed.sites[col]._epochs[ep.announce.epoch]
    opened = 0
    for choice in itertools.product(*(_views(g, u) for u in honest)):
        views = dict(zip(honest, choice))
        start, replies = _run(fed, ep, views, xs)
        j = start.round_id - ep.announce.first_round
        revealed, _ = col_epoch.reveal(start.round_id, g.neighbours(col), ())  # the colluder hands over its shares
        held = [(col, d, share) for d, share in revealed]
        seeds = _seeds(fed, ep, replies, held)
        view = views[victim]
        if victim not in seeds or victim not in replies or view != {col}:
            continue
        y = replies[victim].masked - _self_mask(fed, start, victim, seeds[victim])
        s = P.x25519_agree(col_epoch.secrets.mask_private[j], ep.mask_keys[victim][j])
        m = P.prg_expand(P.pair_mask_key(s, fed.config.digest, start.epoch, start.round_id, victim, col, DIM), DIM)
        y = y - m if victim < col else y + m
        assert np.array_equal(y, to_ring(xs[victim]))
        opened += 1
    assert opened > 0, "negative control: a colluding neighbour must open the victim's input"


def test_a_fast_only_session_refuses_the_signed_path_at_both_ends(cycle):
    fed, ep = cycle
    cfg = fed.config
    with pytest.raises(ConfigError, match="fast-only"):
        fed.coordinator.begin_round(DIM)
    _, start = fed.coordinator.begin_round(DIM, fast=True)
    signed = M.RoundStart(cfg.digest, start.epoch, start.round_id, DIM, start.participants)
    with pytest.raises(ProtocolAbort, match="fast-only; the signed path is refused"):
        fed.sites[cfg.site_ids[0]].handle_round_start(signed, np.zeros(DIM, np.int64))


def test_fast_only_rounds_sum_exactly_and_a_missing_input_releases_nothing():
    fed = _fast_only(12, 4)
    fed.run_epoch(4)
    ids = fed.config.site_ids
    xs = random_inputs(ids, DIM, np.random.default_rng(5))
    res = fed.run_round(xs, DIM, fast=True)
    assert np.array_equal(res.total, sum(xs.values()))
    with pytest.raises(ProtocolAbort, match="fast round without the inputs"):
        fed.run_round(xs, DIM, fast=True, drop_before_input=[ids[3]])
    res = fed.run_round(xs, DIM, fast=True, participants=[s for s in ids if s != ids[3]])  # the retry without it
    assert np.array_equal(res.total, sum(xs[s] for s in ids if s != ids[3]))


def test_fast_only_needs_the_sparse_graph_and_is_bound_into_the_digest():
    with pytest.raises(ConfigError, match="sparse-graph option"):
        make_config(5, fast_only=True)
    a = make_config(5, graph="sparse", neighbours=2)
    b = make_config(5, graph="sparse", neighbours=2, fast_only=True)
    assert a.digest != b.digest
    fed = make_federation(N, config_kw={"graph": "sparse", "neighbours": K})  # not fast-only: still refused
    fed.run_epoch(2)
    with pytest.raises(ConfigError, match="only in a fast-only session"):
        fed.coordinator.begin_round(DIM, fast=True)


def test_the_mixed_fast_and_signed_attack_opens_nothing_in_a_fast_only_session():
    """The attack that keeps fast rounds refused on ordinary sparse sessions (test_sparse_fast_attack.py):
    here every site refuses the signed half, so no mask key is recovered and nothing opens."""
    from .test_sparse_fast_attack import K as AK, N as AN, mixed_attack

    fed = _fast_only(AN, AK)
    ep = fed.run_epoch(2 * max(math.comb(AK, j) for j in range(AK + 1)))
    victim = fed.config.site_ids[0]
    for w_set in itertools.combinations(ep.graph.neighbours(victim), ep.graph.threshold - 1):
        assert not mixed_attack(fed, ep, victim, w_set)
