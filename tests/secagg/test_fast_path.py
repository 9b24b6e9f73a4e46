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

from common.secagg import (
    ConfigError,
    FastMaskedInput,
    FastRoundStart,
    InvalidMessage,
    OutOfOrder,
    ProtocolAbort,
    ReplayError,
)
from common.secagg import messages as M

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
