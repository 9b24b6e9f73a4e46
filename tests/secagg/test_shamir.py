"""Shamir sharing: every t-subset reconstructs, t − 1 shares fail, tampered shares are detected."""
from __future__ import annotations

import itertools
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsbdt.common.secagg import shamir
from fedsbdt.common.secagg.shamir import PRIME, ShamirError

from .conftest import DeterministicRandom


def _is_probable_prime(n: int, rounds: int = 40) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    r = random.Random(7)
    for _ in range(rounds):
        x = pow(r.randrange(2, n - 1), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_prime_is_smallest_prime_above_2_256():
    assert PRIME == 2**256 + 297
    assert _is_probable_prime(PRIME)
    assert not any(_is_probable_prime(2**256 + k) for k in range(1, 297))
    # every 32-byte secret is a field element
    assert shamir.secret_to_int(b"\xff" * 32) < PRIME


@pytest.mark.parametrize("n,t", [(2, 2), (3, 2), (5, 3), (7, 4), (7, 7), (6, 1)])
def test_every_t_subset_reconstructs_and_t_minus_1_fails(n, t):
    secret = shamir.secret_to_int(os.urandom(32))
    xs = list(range(1, n + 1))
    shares = shamir.split(secret, t, xs, DeterministicRandom(b"s%d%d" % (n, t)))
    pts = list(zip(xs, shares))
    for subset in itertools.combinations(pts, t):
        assert shamir.reconstruct(subset, t) == secret
        assert shamir.reconstruct_checked(subset, t) == secret
    for subset in itertools.combinations(pts, t - 1):
        with pytest.raises(ShamirError):
            shamir.reconstruct(subset, t)
        if t > 1:
            # interpolating t−1 shares as if the degree were lower does not give the secret
            assert shamir.reconstruct(subset, t - 1) != secret


def test_t_minus_1_shares_are_consistent_with_any_secret():
    """Perfect secrecy, concretely: for t−1 shares and any candidate secret there is a degree
    t−1 polynomial through (0, candidate) and the shares, so the shares rule out no value."""
    t, xs = 3, [1, 2, 3, 4]
    shares = shamir.split(12345, t, xs, os.urandom)
    known = list(zip(xs[: t - 1], shares[: t - 1]))
    for candidate in (0, 1, 12345, PRIME - 1):
        # the polynomial through (0, candidate) and the known shares, evaluated at a fresh x
        y4 = shamir._interpolate_at([(0, candidate)] + known, xs[-1])
        completed = known + [(xs[-1], y4)]
        assert shamir.reconstruct(completed, t) == candidate
        assert shamir.reconstruct_checked(completed + [(0 + 7, shamir._interpolate_at(completed, 7))], t) == candidate


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    secret=st.integers(0, 2**256 - 1),
    n=st.integers(2, 9),
    data=st.data(),
)
def test_property_random_subsets(secret, n, data):
    t = data.draw(st.integers(1, n))
    xs = sorted(data.draw(st.sets(st.integers(1, 1000), min_size=n, max_size=n)))
    shares = shamir.split(secret, t, xs, os.urandom)
    subset = data.draw(st.lists(st.sampled_from(list(zip(xs, shares))), min_size=t, max_size=n, unique=True))
    assert shamir.reconstruct(subset, t) == secret
    assert shamir.reconstruct_checked(subset, t) == secret
    assert shamir.int_to_secret(secret) == secret.to_bytes(32, "big")


def test_tampered_share_detected_with_extra_shares():
    secret = 987654321
    xs = [1, 2, 3, 4, 5]
    shares = shamir.split(secret, 3, xs, os.urandom)
    pts = list(zip(xs, shares))
    for i in range(5):
        bad = list(pts)
        bad[i] = (bad[i][0], (bad[i][1] + 1) % PRIME)
        with pytest.raises(ShamirError, match="inconsistent"):
            shamir.reconstruct_checked(bad, 3)
        # and plain reconstruction from a set containing it yields a wrong secret
        if i < 3:
            assert shamir.reconstruct(bad, 3) != secret


def test_batch_reconstruction_matches_single():
    xs = [2, 5, 7, 9]
    secrets = [1, 2**255 + 3, 0, 42]
    table = shamir.split_many(secrets, 3, xs, os.urandom)
    assert shamir.reconstruct_many(xs, table, 3) == secrets
    with pytest.raises(ShamirError):
        shamir.reconstruct_many(xs[:2], [row[:2] for row in table], 3)


def _byte_matrices(table, holders: int):
    """Holder k's shares of every secret as a (secrets × 33) big-endian byte matrix (a reply's share list)."""
    import numpy as np

    return [np.frombuffer(b"".join(row[k].to_bytes(shamir.SHARE_SIZE, "big") for row in table), np.uint8)
            .reshape(len(table), shamir.SHARE_SIZE) for k in range(holders)]


@pytest.mark.parametrize("t, n, secrets", [(1, 1, 1), (3, 5, 7), (51, 100, 100), (200, 201, 3)])
def test_packed_batch_reconstruction_equals_the_batch_of_integers(t, n, secrets):
    """reconstruct_many_packed (each holder's shares in one long integer) against reconstruct_many, on real
    sharings and on the largest share values (p − 1 everywhere: the widest sums, where a slot too narrow
    would carry into its neighbour)."""
    rng = random.Random(t * 1000 + n)
    xs = rng.sample(range(1, 10 * n + 1), n)
    want = [rng.randrange(2**256) for _ in range(secrets)]
    table = shamir.split_many(want, t, xs, os.urandom)
    assert shamir.reconstruct_many_packed(xs, _byte_matrices(table, n), t) == want
    worst = [[PRIME - 1] * n for _ in range(secrets)]
    assert shamir.reconstruct_many_packed(xs, _byte_matrices(worst, n), t) == shamir.reconstruct_many(xs, worst, t)
    mixed = [[rng.choice((0, 1, PRIME - 1, rng.randrange(PRIME))) for _ in range(n)] for _ in range(secrets)]
    assert shamir.reconstruct_many_packed(xs, _byte_matrices(mixed, n), t) == shamir.reconstruct_many(xs, mixed, t)
    if t > 1:
        with pytest.raises(ShamirError):
            shamir.reconstruct_many_packed(xs[:t - 1], _byte_matrices(table, t - 1), t)


def test_invalid_inputs_are_refused():
    with pytest.raises(ShamirError):
        shamir.split(1, 3, [1, 2], os.urandom)  # t > n
    with pytest.raises(ShamirError):
        shamir.split(1, 0, [1, 2], os.urandom)
    with pytest.raises(ShamirError):
        shamir.split(1, 2, [1, 1, 2], os.urandom)  # duplicate x
    with pytest.raises(ShamirError):
        shamir.split(1, 2, [0, 1], os.urandom)  # x = 0 would reveal the secret
    with pytest.raises(ShamirError):
        shamir.split(PRIME, 2, [1, 2], os.urandom)
    with pytest.raises(ShamirError):
        shamir.decode_share(PRIME.to_bytes(33, "big"))
    with pytest.raises(ShamirError):
        shamir.decode_share(b"\x00" * 32)
    with pytest.raises(ShamirError):
        shamir.int_to_secret(2**256)
    assert shamir.decode_share(shamir.encode_share(PRIME - 1)) == PRIME - 1


def test_fresh_polynomials_each_time():
    a = shamir.split(5, 3, [1, 2, 3], os.urandom)
    b = shamir.split(5, 3, [1, 2, 3], os.urandom)
    assert a != b
