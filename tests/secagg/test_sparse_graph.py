"""Sparse-graph secure aggregation (Bell et al., CCS 2020): the public graph, the local threshold rule,
masks cancelling on every graph, the dropout matrix per neighbourhood, a lying coordinator that shows
two neighbourhoods different survivor sets, restarts, and the invariant audit per neighbourhood."""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from scipy.stats import hypergeom

from fedsbdt.common.fixedpoint import from_ring
from fedsbdt.common.secagg import ConfigError, InvalidMessage, ProtocolAbort, SecAggCoordinator, SecAggSite
from fedsbdt.common.secagg import messages as M
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg import shamir
from fedsbdt.common.secagg.config import session_digest
from fedsbdt.common.secagg.graph import (
    check_sparse_parameters,
    epoch_graph,
    hypergeometric_tail,
    local_threshold,
    suggested_neighbours,
)
from fedsbdt.common.secagg.site import EpochReady

from .conftest import identities, make_config, make_federation, plain_sum, random_inputs, site_ids

DIM = 5


def sparse_federation(n: int, k: int, c: int = 0, **kw):
    return make_federation(n, config_kw={"graph": "sparse", "neighbours": k, "assumed_colluders": c}, **kw)


# =========================================================================== the graph

def test_graph_is_a_deterministic_k_regular_function_of_the_digest():
    ids = site_ids(30)
    for k in (2, 4, 8, 16):
        for seed in range(5):
            digest = P.sha256(b"epoch", bytes([k, seed]))
            g = epoch_graph(digest, ids, k, 0)
            assert g == epoch_graph(digest, tuple(reversed(ids)), k, 0)  # input order is irrelevant
            assert g.members == ids
            for u in ids:
                nb = g.neighbours(u)
                assert len(nb) == k and u not in nb and list(nb) == sorted(set(nb))
                assert all(u in g.neighbours(v) for v in nb)  # undirected
                assert g.holders(u) == tuple(sorted((*nb, u)))
            other = epoch_graph(P.sha256(b"other", bytes([k, seed])), ids, k, 0)
            assert other.adjacency != g.adjacency


def test_graph_falls_back_to_complete_when_k_reaches_the_roster():
    g = epoch_graph(b"\0" * 32, site_ids(5), 8, 1)
    assert all(g.neighbours(u) == tuple(v for v in site_ids(5) if v != u) for u in site_ids(5))
    assert g.threshold == (5 + 1) // 2 + 1  # the session rule 2t > n + c


def test_neighbourhoods_are_uniform_k_subsets():
    """The random relabelling makes N(u) a uniform k-subset of the others: each other site is a neighbour
    of a fixed site with probability k/(n − 1) (5σ binomial bounds over 1,500 digests)."""
    n, k, trials = 10, 4, 1500
    ids = site_ids(n)
    counts = dict.fromkeys(ids[1:], 0)
    for i in range(trials):
        g = epoch_graph(P.sha256(b"uniform", i.to_bytes(4, "big")), ids, k, 0)
        for v in g.neighbours(ids[0]):
            counts[v] += 1
    p = k / (n - 1)
    sd = (trials * p * (1 - p)) ** 0.5
    for v, c in counts.items():
        assert abs(c - trials * p) < 5 * sd, (v, c, trials * p)


def test_graph_changes_when_any_advertisement_changes():
    """The epoch digest covers every advertisement, so re-signing any one site's keys gives another graph;
    dropping one site from the roster does too."""
    fed = sparse_federation(10, 4)
    ep = fed.run_epoch(2)
    roster = ep.roster
    base = fed.config.epoch_graph(roster).adjacency
    for i, a in enumerate(roster.adverts):
        key = identities(10)[a.sender]
        enc = P.x25519_generate(lambda n: bytes([i + 1]) * n)[1]
        unsigned = M.AdvertiseKeys(a.session_digest, a.epoch, a.first_round, a.sender, enc, a.mask_keys, bytes(64))
        changed = M.AdvertiseKeys(a.session_digest, a.epoch, a.first_round, a.sender, enc, a.mask_keys,
                                  P.ed25519_sign(key, M.AdvertiseKeys.SIGN_DOMAIN, unsigned.signing_bytes()))
        other = M.EpochRoster(roster.session_digest, roster.epoch, roster.adverts[:i] + (changed,) + roster.adverts[i + 1:])
        assert other.epoch_digest() != roster.epoch_digest()
        assert fed.config.epoch_graph(other).adjacency != base, a.sender
    smaller = M.EpochRoster(roster.session_digest, roster.epoch, roster.adverts[1:])
    assert fed.config.epoch_graph(smaller).adjacency != base


def test_every_party_derives_the_same_graph_and_deals_only_to_neighbours():
    fed = sparse_federation(12, 4)
    ep = fed.run_epoch(3)
    g = ep.graph
    assert g is not None and g == fed.config.epoch_graph(ep.roster)
    for s, site in fed.sites.items():
        mine = site._epochs[0]
        assert isinstance(mine, EpochReady) and mine.graph == g
        assert set(mine.held) == set(g.holders(s))  # shares held only from the closed neighbourhood
    for hop in fed.transcript:
        m = hop.message
        if isinstance(m, M.ShareKeys):
            assert tuple(r.holder for r in m.rows) == g.holders(m.sender)
            assert tuple(b.recipient for b in m.encrypted) == g.neighbours(m.sender)
        if isinstance(m, M.EpochShares):
            assert m.dealers == g.holders(m.recipient)
    # a restarted site and a restarted coordinator recompute the same graph
    site = fed.restart_site("site-03")
    assert site._epochs[0].graph == g
    assert SecAggCoordinator(fed.config).config.epoch_graph(ep.roster) == g


# =========================================================================== the threshold rule

@pytest.mark.parametrize("n,k,c", [(20, 4, 0), (50, 10, 3), (100, 24, 10), (200, 32, 20), (300, 40, 60), (1000, 40, 50)])
def test_threshold_rule_against_scipy_hypergeometric(n, k, c):
    bits = 40
    lt = local_threshold(n, k, c, bits)
    tail = lambda above: hypergeom.sf(above, n - 1, c, k)  # noqa: E731  P[X > above], independent oracle
    for above in range(0, min(c, k) + 1):
        assert hypergeometric_tail(n - 1, c, k, above) == pytest.approx(tail(above), rel=1e-9, abs=1e-300)
    assert (n - c) * tail(lt.colluder_bound) <= 2.0 ** -bits
    if lt.colluder_bound > 0:  # the smallest such bound
        assert (n - c) * tail(lt.colluder_bound - 1) > 2.0 ** -bits
    assert lt.threshold == (k + 1 + lt.colluder_bound) // 2 + 1
    assert 2 * lt.threshold > k + 1 + lt.colluder_bound  # the session rule, per neighbourhood


def test_sparse_parameters_are_validated_with_clear_errors():
    assert check_sparse_parameters(100, 20, 1).threshold <= 20
    with pytest.raises(ConfigError, match="even"):
        check_sparse_parameters(100, 7, 1)
    with pytest.raises(ConfigError, match="complete"):
        check_sparse_parameters(10, 10, 1)
    with pytest.raises(ConfigError, match="too small"):
        check_sparse_parameters(200, 4, 60)
    with pytest.raises(ConfigError, match="graph must be"):
        make_config(10, graph="star")
    with pytest.raises(ConfigError, match="neighbours"):
        make_config(10, graph="sparse", neighbours=1)
    assert suggested_neighbours(200) == 32 and suggested_neighbours(1000) == 40


def test_session_digest_binds_the_graph_and_is_unchanged_for_the_complete_graph():
    complete = make_config(12)
    assert complete.digest == session_digest(complete.session_id, complete.threshold, complete.roster)
    a = make_config(12, graph="sparse", neighbours=4)
    b = make_config(12, graph="sparse", neighbours=6)
    assert len({complete.digest, a.digest, b.digest}) == 3


# =========================================================================== rounds

def test_masks_cancel_on_every_graph():
    rng = np.random.default_rng(7)
    for n, k in [(5, 2), (8, 4), (11, 4), (14, 6), (15, 8)]:
        fed = sparse_federation(n, k)
        for _ in range(2):  # two epochs: two different graphs
            fed.run_epoch(1)
            xs = random_inputs(fed.config.site_ids, DIM, rng)
            _, start = fed.coordinator.begin_round(DIM)
            ys = {s: fed.to_site(s, start, xs[s]) for s in start.participants}
            total = np.zeros(DIM, dtype=np.uint64)
            for s, y in ys.items():
                total += y.masked
                ep = fed.sites[s]._epochs[start.epoch]
                slot = start.round_id - ep.announce.first_round
                total -= P.prg_expand(P.self_mask_key(ep.secrets.seeds[slot], fed.config.digest, start.epoch,
                                                      start.round_id, s, DIM), DIM)
            assert np.array_equal(from_ring(total), plain_sum(xs, start.participants)), (n, k)


def drive_round(fed, xs, drop_input=(), drop_consistency=(), drop_unmask=(), d=DIM):
    """A round in which a site that refuses (ProtocolAbort/InvalidMessage) simply stays silent, as over a transport."""
    rnd, start = fed.coordinator.begin_round(d)

    def ask(s, msg, *args):
        try:
            reply = fed.to_site(s, msg, *args)
        except (ProtocolAbort, InvalidMessage):
            return
        rnd.receive(reply)

    for s in start.participants:
        if s not in drop_input:
            ask(s, start, xs[s])
    creq = rnd.close_inputs()
    for s in creq.survivors:
        if s not in drop_consistency:
            ask(s, creq)
    ureq = rnd.close_consistency()
    for s, _ in ureq.signatures:
        if s not in drop_unmask:
            ask(s, ureq)
    return rnd.finalize()


def predicted(g, t, participants, drop_input, drop_consistency, drop_unmask):
    """Independent model of when a sparse round completes (None: it fails)."""
    u3 = [s for s in participants if s not in drop_input]
    if len(u3) < t:
        return None
    signers = [s for s in u3 if s not in drop_consistency]
    if len(signers) < len(u3):  # a survivor that does not sign: its neighbours may not reveal its seed share
        return None
    tk = g.threshold
    responders = {h for h in signers if h not in drop_unmask and sum(v in signers for v in g.holders(h)) >= tk}
    for v in participants:
        if sum(h in responders for h in g.holders(v)) < tk:
            return None
    return tuple(u3)


def test_dropout_matrix_per_neighbourhood():
    """Random drops at every round stage: the round completes with the exact sum exactly when every
    participant keeps t_k responding holders in its neighbourhood (and each responder saw t_k
    neighbourhood signatures); otherwise it fails cleanly and the next round (new id) still works."""
    n, k = 14, 6
    fed = sparse_federation(n, k)
    rng = np.random.default_rng(11)
    outcomes = {"ok": 0, "failed": 0}
    for trial in range(36):
        if fed.coordinator.slots_remaining() == 0:
            fed.run_epoch(12)
        ep = fed.coordinator.epoch(fed.coordinator.ready_epochs()[0])
        ids = fed.config.site_ids
        p = 0.04 + 0.06 * (trial % 3)
        drops = [{s for s in ids if rng.random() < p} for _ in range(3)]
        xs = random_inputs(ids, DIM, rng)
        want = predicted(ep.graph, fed.config.threshold, ids, *drops)
        try:
            res = drive_round(fed, xs, *drops)
        except ProtocolAbort:
            assert want is None, (trial, drops)
            outcomes["failed"] += 1
            continue
        assert want == res.survivors, (trial, drops)
        assert np.array_equal(res.total, plain_sum(xs, res.survivors))
        outcomes["ok"] += 1
    assert outcomes["ok"] >= 8 and outcomes["failed"] >= 4, outcomes


def test_dropped_site_with_too_few_live_neighbours_fails_cleanly_then_a_retry_succeeds():
    fed = sparse_federation(12, 4)
    ep = fed.run_epoch(4)
    g = ep.graph
    w = "site-00"
    gone = set(g.neighbours(w)[: k_minus(g)])  # leave w with fewer than t_k live holders
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(3))
    with pytest.raises(ProtocolAbort, match="revealed shares, local threshold"):
        drive_round(fed, xs, drop_input={w}, drop_unmask=gone)
    res = drive_round(fed, xs, drop_input={w})  # the same dropout, neighbours alive: a new round id works
    assert w in res.dropped and np.array_equal(res.total, plain_sum(xs, res.survivors))


def k_minus(g):
    """How many of a site's neighbours must vanish so that its closed neighbourhood (minus itself) has < t_k."""
    return g.degree - g.threshold + 1


# =========================================================================== lying coordinator

def neighbourhood_split_attack(k: int, local_colluders: int) -> bool:
    """The coordinator tells one part of the victim's neighbourhood "v is alive" (U_A = P) and the other
    "v dropped" (U_B = P minus v).  Every site outside N[v] and ``local_colluders`` of v's neighbours collude:
    their state is forked, so they sign and reveal for both sets.  Every split of the honest neighbours is
    tried.  True iff some split yields t_k seed shares and t_k key shares of v, opening v's masked input."""
    n = 12
    fed = sparse_federation(n, k, c=1)
    ep = fed.run_epoch(1)
    cfg, g = fed.config, ep.graph
    ids, victim, tk = cfg.site_ids, cfg.site_ids[0], g.threshold
    nb = g.neighbours(victim)
    bad = set(ids) - set(g.holders(victim)) | set(nb[:local_colluders])
    honest_nb = [h for h in nb if h not in bad]
    _, start = fed.coordinator.begin_round(DIM)
    xs = random_inputs(ids, DIM, np.random.default_rng(5))
    ys = {s: fed.sites[s].handle_round_start(start, xs[s]) for s in ids}
    u_a, u_b = ids, tuple(s for s in ids if s != victim)
    for r in range(len(honest_nb) + 1):
        for group_b in itertools.combinations(honest_nb, r):
            group_a = [victim] + [h for h in honest_nb if h not in group_b]

            def fork(s):
                return SecAggSite(cfg, s, identities(n)[s], copy.deepcopy(fed.storages[s]))

            def collect(survivors, honest):
                signers = {s: fork(s) for s in [*honest, *sorted(bad)]}
                req = M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, survivors)
                sigs = {s: site.handle_consistency_request(req).signature for s, site in signers.items()}
                dropped = tuple(s for s in ids if s not in survivors)
                ureq = M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, survivors, dropped, tuple(sorted(sigs.items())))
                out = []
                for site in signers.values():
                    try:
                        out.append(site.handle_unmask_request(ureq))
                    except (ProtocolAbort, InvalidMessage):
                        pass
                return out

            side_a, side_b = collect(u_a, group_a), collect(u_b, list(group_b))
            seed_pts = [(cfg.x_coordinate(m.sender), int.from_bytes(dict(m.seed_shares)[victim], "big"))
                        for m in side_a if victim in dict(m.seed_shares)]
            key_pts = [(cfg.x_coordinate(m.sender), int.from_bytes(dict(m.key_shares)[victim], "big"))
                       for m in side_b if victim in dict(m.key_shares)]
            if len(seed_pts) >= tk and len(key_pts) >= tk:
                seed = shamir.int_to_secret(shamir.reconstruct(seed_pts, tk))
                sk = shamir.int_to_secret(shamir.reconstruct(key_pts, tk))
                slot = start.round_id - ep.announce.first_round
                opened = ys[victim].masked.copy()
                opened -= P.prg_expand(P.self_mask_key(seed, cfg.digest, start.epoch, start.round_id, victim, DIM), DIM)
                for v in nb:
                    m = P.prg_expand(P.pair_mask_key(P.x25519_agree(sk, ep.mask_keys[v][slot]), cfg.digest,
                                                     start.epoch, start.round_id, victim, v, DIM), DIM)
                    opened = opened - m if victim < v else opened + m
                assert np.array_equal(from_ring(opened), xs[victim])
                return True
    return False


@pytest.mark.parametrize("k", [4, 6])
def test_two_neighbourhoods_shown_different_survivor_sets(k):
    """Up to the rule's colluder bound c_k in the victim's neighbourhood (and every site outside it colluding)
    the split fails for every split; it can only succeed where 2·t_k ≤ K + colluders, and it does open the
    input when the whole neighbourhood colludes (so the harness can detect a success)."""
    g = sparse_federation(12, k, c=1).config.local_threshold
    opened = {c_v: neighbourhood_split_attack(k, c_v) for c_v in range(0, k + 1)}
    for c_v, ok in opened.items():
        if ok:
            assert 2 * g.threshold <= k + 1 + c_v, (k, c_v)
        if c_v <= g.colluder_bound:
            assert not ok, (k, c_v)
    assert opened[k]


def test_signatures_on_another_neighbourhoods_survivor_set_do_not_count():
    """A site shown U_B refuses an unmask request that borrows signatures made on U_A (verification fails),
    and one whose own neighbourhood has fewer than t_k signers on its set refuses too."""
    fed = sparse_federation(12, 4)
    ep = fed.run_epoch(1)
    cfg, g = fed.config, ep.graph
    ids = cfg.site_ids
    _, start = fed.coordinator.begin_round(DIM)
    xs = random_inputs(ids, DIM, np.random.default_rng(9))
    for s in ids:
        fed.sites[s].handle_round_start(start, xs[s])
    h = ids[1]
    others = g.neighbours(h)
    far_site = next(x for x in ids if x not in g.holders(h))
    u_a, u_b = ids, tuple(s for s in ids if s != far_site)  # h is shown U_B: a site outside its neighbourhood dropped
    sig_b = {h: fed.sites[h].handle_consistency_request(M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, u_b)).signature}
    sig_a = {s: fed.sites[s].handle_consistency_request(M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, u_a)).signature
             for s in u_b if s != h}  # signed on U_A by sites that are survivors in both sets
    dropped = tuple(s for s in ids if s not in u_b)
    borrowed = {**sig_a, **sig_b}
    with pytest.raises(InvalidMessage, match="invalid consistency signature"):
        fed.sites[h].handle_unmask_request(M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, u_b, dropped,
                                                           tuple(sorted(borrowed.items()))))
    # only signatures from outside h's neighbourhood (plus its own): valid, but they do not count for h
    far = {s: sig for s, sig in sig_a.items() if s not in others}
    assert len(far) + 1 >= cfg.threshold
    with pytest.raises(ProtocolAbort, match="neighbourhood"):
        fed.sites[h].handle_unmask_request(M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, u_b, dropped,
                                                           tuple(sorted({**far, **sig_b}.items()))))


# =========================================================================== audit

def test_invariant_audit_per_neighbourhood_with_random_dropouts():
    """40 rounds with random dropouts at every stage on a sparse graph.  From the transcript: no site's seed
    and mask key are both revealed for one round (not even partially); shares come only from the dealer's
    closed neighbourhood; every completed round's sum is exact; pair masks are only between neighbours."""
    n, k, d = 14, 6, 4
    fed = sparse_federation(n, k, c=1)
    rng = np.random.default_rng(99)
    done = failed = 0
    graphs = {}
    for r in range(40):
        if fed.coordinator.slots_remaining() == 0:
            ep = fed.run_epoch(10)
            graphs[ep.epoch] = ep.graph
        drops = [{s for s in fed.config.site_ids if rng.random() < 0.04} for _ in range(3)]
        xs = random_inputs(fed.config.site_ids, d, rng)
        try:
            res = drive_round(fed, xs, *drops, d=d)
        except ProtocolAbort:
            failed += 1
            continue
        done += 1
        assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    assert done >= 20 and failed >= 1, (done, failed)
    revealed: dict[tuple[int, str], set[int]] = {}
    epochs_of_round: dict[int, int] = {}
    for hop in fed.transcript:
        m = hop.message
        if isinstance(m, M.RoundStart):
            epochs_of_round[m.round_id] = m.epoch
        if isinstance(m, M.UnmaskResponse):
            g = graphs[m.epoch]
            for kind, entries in ((M.KIND_SEED, m.seed_shares), (M.KIND_KEY, m.key_shares)):
                for dealer, _ in entries:
                    assert m.sender in g.holders(dealer)
                    revealed.setdefault((m.round_id, dealer), set()).add(kind)
    assert not [key for key, kinds in revealed.items() if len(kinds) > 1]
    assert {M.KIND_SEED, M.KIND_KEY} <= set().union(*revealed.values())



def test_a_bad_revealed_share_is_blamed_and_survived_on_the_graph():
    """A holder reveals a wrong seed share of a neighbour: the reconstruction from the first t_k holders fails
    its commitment, the holder is blamed from its per-share commitment, and the secret comes from the others."""
    fed = sparse_federation(14, 6)
    ep = fed.run_epoch(2)
    g = ep.graph
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(21))
    rnd, start = fed.coordinator.begin_round(DIM)
    for s in start.participants:
        rnd.receive(fed.to_site(s, start, xs[s]))
    creq = rnd.close_inputs()
    for s in creq.survivors:
        rnd.receive(fed.to_site(s, creq))
    ureq = rnd.close_consistency()
    victim = "site-05"
    liar = min(g.holders(victim), key=fed.config.x_coordinate)  # among the first t_k holders: the fast path fails
    for s, _ in ureq.signatures:
        resp = fed.to_site(s, ureq)
        if s == liar:
            seeds = tuple((d, (int.from_bytes(v, "big") ^ 1).to_bytes(len(v), "big") if d == victim else v)
                          for d, v in resp.seed_shares)
            resp = M.UnmaskResponse(resp.session_digest, resp.epoch, resp.round_id, resp.sender, seeds, resp.key_shares)
        rnd.receive(resp)
    res = rnd.finalize()
    assert res.blamed == (liar,)
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))


def test_a_neighbours_seed_share_is_revealed_only_to_a_statement_it_signed():
    """The coordinator gives site u a smaller participant set (u masks only with part of its neighbourhood) and
    asks u's other neighbours, shown the full set, to reveal u's seed share.  They refuse: u did not sign their
    statement (missing), and u's signature on its own statement does not verify on theirs."""
    for _ in range(20):  # a random graph in which two of u's other neighbours see t_k signers without u's side
        fed = sparse_federation(12, 4)
        ep = fed.run_epoch(1)
        cfg, g = fed.config, ep.graph
        ids = cfg.site_ids
        u = ids[0]
        part_a = set(g.neighbours(u)[:2])
        askable = [v for v in g.neighbours(u)[2:]
                   if sum(1 for h in g.holders(v) if h not in {u} | part_a) >= g.threshold]
        if len(askable) >= 2:
            break
    p_u = tuple(sorted({u} | part_a | {s for s in ids if s not in g.holders(u)}))
    _, start = fed.coordinator.begin_round(DIM)
    start_u = M.RoundStart(start.session_digest, start.epoch, start.round_id, DIM, p_u)
    xs = random_inputs(ids, DIM, np.random.default_rng(4))
    for s in ids:
        fed.sites[s].handle_round_start(start_u if s in {u} | part_a else start, xs[s])

    def sign(s, survivors):
        req = M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, survivors)
        return fed.sites[s].handle_consistency_request(req).signature

    sig_u = sign(u, p_u)
    full = {s: sign(s, ids) for s in ids if s not in {u} | part_a}
    b, b2 = askable[:2]

    def ask(sigs):
        return fed.sites[b].handle_unmask_request(M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, ids, (),
                                                                  tuple(sorted(sigs.items()))))
    with pytest.raises(ProtocolAbort, match="did not sign"):
        ask(full)
    assert fed.sites[b].round_stage(start.round_id) == "aborted"  # persisted: b reveals nothing in this round
    forged = {**full, u: sig_u, **{a: bytes(64) for a in part_a}}  # u's real signature, but on its own statement
    with pytest.raises(InvalidMessage, match=f"invalid consistency signature from '{u}'"):
        fed.sites[b2].handle_unmask_request(M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, ids, (),
                                                            tuple(sorted(forged.items()))))
