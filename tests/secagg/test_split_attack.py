"""The collusion bound, stated in terms of the plan's declared c (issue 10, attack 2).

The split attack: in one round the coordinator shows survivor set U_A = P_r to
one group of sites and U_B = P_r ∖ {v} to another; colluding sites sign both.
If both statements reach t signatures, the U_A signers reveal their shares of
v's self-mask seed and the U_B signers their shares of v's mask key, and the
coordinator opens v's masked input.  The property test performs it with the
real secure-aggregation state machines (a colluder is a site whose stored
state the coordinator can fork, so it signs and reveals for both sets) for
every (n, t, c, s) with n ≤ 6 that the planner accepts, using the plan's own
survivor rule k_r + c, and checks: it fails with c colluders (the most the
plan declares) and it succeeds with c + 1 exactly where common/guarantee.py
and docs/threat-model.md say it can.
"""
from __future__ import annotations

import copy
from functools import lru_cache

import numpy as np
import pytest

from fedsbdt.common.fixedpoint import from_ring
from fedsbdt.common.guarantee import collusion_guarantee, default_colluders, split_attack_possible
from fedsbdt.common.secagg import ProtocolAbort, SecAggSite
from fedsbdt.common.secagg import messages as M
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg import shamir
from fedsbdt.common.secagg.errors import InvalidMessage
from fedsbdt.common.secagg.loopback import LoopbackFederation
from fedsbdt.common.federation.plan import PlanError, check_trust_parameters, noise_divisor

from .conftest import identities, make_config

DIM = 4
N_MAX = 6


def accepted(n_max: int = N_MAX):
    """Every (n, t, c, s) with 2 ≤ n ≤ n_max that the planner accepts."""
    out = []
    for n in range(2, n_max + 1):
        for t in range(1, n + 1):
            for c in range(0, n + 1):
                for s in range(0, n + 1):
                    try:
                        check_trust_parameters(n, t, c, s)
                    except PlanError:
                        continue
                    out.append((n, t, c, s))
    return out


def test_the_planner_rule_is_what_the_docs_say():
    combos = accepted()
    assert combos and all(2 * t > n + c and 0 <= s <= n - t for n, t, c, s in combos)
    for n in range(2, N_MAX + 1):  # the default c is the largest c the threshold admits
        for t in range(n // 2 + 1, n + 1):
            c = default_colluders(n, t)
            check_trust_parameters(n, t, c, 0)
            with pytest.raises(PlanError):
                check_trust_parameters(n, t, c + 1, 0)
            assert t - c >= 1  # the noise divisor is never below 1


@lru_cache(maxsize=None)
def _epoch(n: int, t: int, c: int):
    fed = LoopbackFederation(make_config(n, t, assumed_colluders=c), identities(n))
    fed.run_epoch(2)
    return fed


def split_attack(n: int, t: int, c: int, s: int, colluders: int) -> bool:
    """Run the split attack with ``colluders`` colluding sites; True iff the victim's input was opened."""
    base = _epoch(n, t, c)
    cfg = base.config
    ids = cfg.site_ids

    def rule(start):  # the federation's survivor rule (client/site.py): |U3| ≥ k_r + c
        return noise_divisor(t, c, s, len(start.participants)) + c

    # fresh site objects on copies of the prepared epoch state (each combination gets its own round)
    stores = {sid: copy.deepcopy(base.storages[sid]) for sid in ids}
    sites = {sid: SecAggSite(cfg, sid, identities(n)[sid], stores[sid], min_survivors=rule) for sid in ids}
    coord = copy.deepcopy(base.coordinator)
    _, start = coord.begin_round(DIM)
    assert start.participants == ids
    rng = np.random.default_rng(n * 1000 + t * 100 + c * 10 + s)
    xs = {sid: rng.integers(-2**40, 2**40, DIM, dtype=np.int64) for sid in ids}
    ys = {sid: sites[sid].handle_round_start(start, xs[sid]) for sid in ids}

    bad = set(ids[n - colluders:])  # the colluders: the last sites; the victim is site-00
    victim = ids[0]
    honest = [sid for sid in ids if sid not in bad]
    half = (len(honest) + 1) // 2  # the balanced split maximises the smaller group; the victim is in group A
    group_a, group_b = honest[:half], honest[half:]
    twins = {sid: SecAggSite(cfg, sid, identities(n)[sid], copy.deepcopy(stores[sid]), min_survivors=rule)
             for sid in bad}  # a colluder's state forked after its masked input: it can sign twice
    u_a, u_b = ids, tuple(x for x in ids if x != victim)

    def collect(survivors, signers):
        req = M.ConsistencyRequest(cfg.digest, start.epoch, start.round_id, survivors)
        sigs = {}
        for sid, site in signers:
            try:
                sigs[sid] = site.handle_consistency_request(req).signature
            except (ProtocolAbort, InvalidMessage):
                pass  # refused: the set is too small for this site's survivor rule
        dropped = tuple(x for x in ids if x not in survivors)
        ureq = M.UnmaskRequest(cfg.digest, start.epoch, start.round_id, survivors, dropped,
                               tuple(sorted(sigs.items())))
        responses = []
        for sid, site in signers:
            if sid in sigs:
                try:
                    responses.append(site.handle_unmask_request(ureq))
                except (ProtocolAbort, InvalidMessage):
                    pass  # fewer than t signatures: an honest site reveals nothing
        return responses

    side_a = collect(u_a, [(x, sites[x]) for x in group_a] + [(x, sites[x]) for x in sorted(bad)])
    side_b = collect(u_b, [(x, sites[x]) for x in group_b] + [(x, twins[x]) for x in sorted(bad)])
    seed_pts = [(cfg.x_coordinate(r.sender), int.from_bytes(dict(r.seed_shares)[victim], "big"))
                for r in side_a if victim in dict(r.seed_shares)]
    key_pts = [(cfg.x_coordinate(r.sender), int.from_bytes(dict(r.key_shares)[victim], "big"))
               for r in side_b if victim in dict(r.key_shares)]
    if len(seed_pts) < t or len(key_pts) < t:
        return False
    seed = shamir.int_to_secret(shamir.reconstruct(seed_pts, t))
    sk = shamir.int_to_secret(shamir.reconstruct(key_pts, t))
    ep = coord.epoch(start.epoch)
    slot = start.round_id - ep.announce.first_round
    opened = ys[victim].masked.copy()
    opened -= P.prg_expand(P.self_mask_key(seed, cfg.digest, start.epoch, start.round_id, victim, DIM), DIM)
    for v in ids:
        if v != victim:
            m = P.prg_expand(P.pair_mask_key(P.x25519_agree(sk, ep.mask_keys[v][slot]), cfg.digest, start.epoch,
                                             start.round_id, victim, v, DIM), DIM)
            opened = opened - m if victim < v else opened + m
    assert np.array_equal(from_ring(opened), xs[victim])  # both secrets: the exact input
    return True


@pytest.mark.parametrize("n,t,c,s", accepted())
def test_split_attack_fails_with_c_colluders_and_succeeds_with_c_plus_1_only_where_documented(n, t, c, s):
    assert not split_attack(n, t, c, s, c), "the split attack succeeded with no more colluders than declared"
    if c + 1 < n:  # c + 1 colluders still leave an honest victim
        expected = split_attack_possible(n, t, s, c + 1)
        assert expected == (2 * t == n + c + 1 and s >= 1)  # the condition docs/threat-model.md states
        assert split_attack(n, t, c, s, c + 1) == expected
        assert ("does not hold" in collusion_guarantee(n, t, c, s, "distributed")) == expected


def test_the_issue_counterexample_is_caught_by_the_default_c():
    """n = 5, t = 3, s = 2: declared c = 0 is exactly the default (2t − n − 1 = 0), one colluder opens a site."""
    assert default_colluders(5, 3) == 0
    assert not split_attack(5, 3, 0, 2, 0)
    assert split_attack(5, 3, 0, 2, 1)
    assert "With 1 colluder it does not hold" in collusion_guarantee(5, 3, 0, 2, "distributed")


@pytest.mark.parametrize("n,t,c,s", accepted())
def test_c_colluders_knowing_their_noise_shares_leave_at_least_sigma2_in_every_accepted_sum(n, t, c, s):
    """Every survivor set a site signs (|U3| ≥ k_r + c) holds ≥ σ² of honest noise after the colluders
    subtract their shares, also when the coordinator shows e extra sites to an honest site (privacy.md
    "Distributed noise", step 3: k grows by one per extra site, the honest part by one share)."""
    for p in range(t, n + 1):
        k = noise_divisor(t, c, s, p)
        assert k >= 1
        for u3 in range(k + c, p + 1):
            assert (u3 - c) / k >= 1  # in units of σ²
            for e in range(0, c + 1):
                assert (u3 - c + e) / (k + e) >= 1
        if k + c - 1 >= t:  # one survivor fewer would not hold σ²: the rule is tight, not loose
            assert (k + c - 1 - c) / k < 1
