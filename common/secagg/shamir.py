"""Shamir secret sharing over the prime field GF(p), p = 2^256 + 297.

Secrets are 32-byte strings (self-mask seeds and X25519 private keys), read
as big-endian integers in ``[0, 2^256)``.  ``p = 2^256 + 297`` is the smallest
prime above ``2^256`` (checked by a Miller–Rabin test in the test suite), so a
whole 32-byte secret is one field element — no splitting — and a share is one
field element encoded as 33 big-endian bytes.

A degree ``t − 1`` polynomial with uniformly random coefficients and constant
term equal to the secret is evaluated at the holders' public, distinct,
nonzero x-coordinates (a site's 1-based position in the sorted roster).  Any
``t`` shares determine the secret by Lagrange interpolation at 0; any ``t − 1``
are jointly uniform and independent of it.

Random coefficients are drawn as 48 random bytes reduced mod p (statistical
distance from uniform below 2^-128).

These functions are pure apart from consuming ``randbytes``.  Integrity of
individual shares is *not* provided here: the protocol commits to every share
and to every secret (see ``messages.ShareCommitments``);
:func:`reconstruct_checked` only offers a consistency check when more than
``t`` shares are available.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Iterable, Sequence

import numpy as np

from .errors import SecAggError

PRIME = 2**256 + 297
SECRET_SIZE = 32
SHARE_SIZE = 33
_COEFF_BYTES = 48


class ShamirError(SecAggError):
    """Too few shares, invalid coordinates, or shares that are not consistent."""


def secret_to_int(secret: bytes) -> int:
    """A 32-byte secret as a field element."""
    if len(secret) != SECRET_SIZE:
        raise ShamirError(f"secrets must be {SECRET_SIZE} bytes, got {len(secret)}")
    return int.from_bytes(secret, "big")


def int_to_secret(value: int) -> bytes:
    """Inverse of :func:`secret_to_int`; a value ≥ 2^256 cannot be a shared secret."""
    if not 0 <= value < 2**256:
        raise ShamirError("reconstructed value is not a 32-byte secret (inconsistent shares)")
    return value.to_bytes(SECRET_SIZE, "big")


def encode_share(y: int) -> bytes:
    """33-byte big-endian encoding of a share value in ``[0, p)``."""
    if not 0 <= y < PRIME:
        raise ShamirError("share value out of field range")
    return y.to_bytes(SHARE_SIZE, "big")


def decode_share(b: bytes) -> int:
    """Inverse of :func:`encode_share`; refuses wrong sizes and values ≥ p."""
    if len(b) != SHARE_SIZE:
        raise ShamirError(f"a share must be {SHARE_SIZE} bytes, got {len(b)}")
    y = int.from_bytes(b, "big")
    if y >= PRIME:
        raise ShamirError("share value is not a field element (≥ p)")
    return y


def random_field_element(randbytes: Callable[[int], bytes]) -> int:
    """Near-uniform element of GF(p) (48 random bytes mod p)."""
    return int.from_bytes(randbytes(_COEFF_BYTES), "big") % PRIME


def _check_xs(xs: Sequence[int]) -> None:
    if len(set(xs)) != len(xs):
        raise ShamirError("share x-coordinates must be distinct")
    for x in xs:
        if not (isinstance(x, int) and 0 < x < PRIME):
            raise ShamirError(f"share x-coordinate {x!r} must be a nonzero field element")


def split(secret: int, threshold: int, xs: Sequence[int], randbytes: Callable[[int], bytes]) -> list[int]:
    """Shares ``f(x)`` for each ``x`` in ``xs`` of a fresh random polynomial with ``f(0) = secret``."""
    return split_many([secret], threshold, xs, randbytes)[0]


def split_many(
    secrets: Sequence[int], threshold: int, xs: Sequence[int], randbytes: Callable[[int], bytes]
) -> list[list[int]]:
    """Share each secret independently; ``result[i][k]`` is secret ``i``'s share at ``xs[k]``."""
    xs = list(xs)
    _check_xs(xs)
    if not 1 <= threshold <= len(xs):
        raise ShamirError(f"threshold {threshold} must be between 1 and the number of holders {len(xs)}")
    p = PRIME
    out: list[list[int]] = []
    for s in secrets:
        if not 0 <= s < p:
            raise ShamirError("secret out of field range")
        # coefficients a_1 … a_{t-1}; Horner needs them highest first
        coeffs = [random_field_element(randbytes) for _ in range(threshold - 1)]
        coeffs.reverse()
        row = []
        for x in xs:
            acc = 0
            for c in coeffs:
                acc = (acc + c) * x % p
            row.append((acc + s) % p)
        out.append(row)
    return out


@lru_cache(maxsize=256)
def lagrange_coefficients(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Coefficients λ_i with ``f(0) = Σ λ_i f(x_i)`` for any polynomial of degree < len(xs)."""
    xs = tuple(xs)
    _check_xs(xs)
    p = PRIME
    nums, dens = [], []
    for i, xi in enumerate(xs):
        num = 1
        den = 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj % p
                den = den * (xj - xi) % p
        nums.append(num)
        dens.append(den)
    # one modular inversion for all denominators (Montgomery's trick): prefix products, invert, unwind
    prefix = [1]
    for den in dens:
        prefix.append(prefix[-1] * den % p)
    inv = pow(prefix[-1], -1, p)
    out = [0] * len(xs)
    for i in range(len(xs) - 1, -1, -1):
        out[i] = nums[i] * (inv * prefix[i] % p) % p
        inv = inv * dens[i] % p
    return tuple(out)


def _interpolate_at(points: Sequence[tuple[int, int]], x0: int) -> int:
    p = PRIME
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = 1
        den = 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (x0 - xj) % p
                den = den * (xi - xj) % p
        total = (total + yi * num * pow(den, -1, p)) % p
    return total


def _points(points: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    pts = sorted((int(x), int(y)) for x, y in points)
    _check_xs([x for x, _ in pts])
    for _, y in pts:
        if not 0 <= y < PRIME:
            raise ShamirError("share value out of field range")
    return pts


def reconstruct(points: Iterable[tuple[int, int]], threshold: int) -> int:
    """The secret from at least ``threshold`` shares ``(x, y)``; uses the ``threshold`` smallest x.

    Fewer than ``threshold`` shares raise :class:`ShamirError` — they carry no
    information about the secret.
    """
    pts = _points(points)
    if len(pts) < threshold:
        raise ShamirError(f"need at least {threshold} shares to reconstruct, got {len(pts)}")
    pts = pts[:threshold]
    lam = lagrange_coefficients(tuple(x for x, _ in pts))
    return sum(l * y for l, (_, y) in zip(lam, pts)) % PRIME


def reconstruct_checked(points: Iterable[tuple[int, int]], threshold: int) -> int:
    """Like :func:`reconstruct`, but with more than ``threshold`` shares also checks that every
    extra share lies on the same polynomial, raising :class:`ShamirError` if any does not."""
    pts = _points(points)
    secret = reconstruct(pts, threshold)
    base = pts[:threshold]
    for x, y in pts[threshold:]:
        if _interpolate_at(base, x) != y:
            raise ShamirError(f"share at x={x} is inconsistent with the others (tampered share)")
    return secret


def reconstruct_many(xs: Sequence[int], ys: Sequence[Sequence[int]], threshold: int) -> list[int]:
    """Batch reconstruction of several secrets whose shares sit at the same ``xs``.

    ``ys[i][k]`` is secret ``i``'s share at ``xs[k]``; the first ``threshold``
    coordinates are used (Lagrange coefficients computed once).
    """
    if len(xs) < threshold:
        raise ShamirError(f"need at least {threshold} shares to reconstruct, got {len(xs)}")
    lam = lagrange_coefficients(tuple(xs[:threshold]))
    p = PRIME
    return [sum(l * y for l, y in zip(lam, row[:threshold])) % p for row in ys]


#: bytes per secret in :func:`reconstruct_many_packed`'s sums: λ·y < p² < 2^514, and a sum of up to 2^78
#: such products stays below 2^592 = 256^74, so no secret's sum carries into its neighbour's
_PACKED_SLOT = 2 * SHARE_SIZE + 8


def reconstruct_many_packed(xs: Sequence[int], shares: Sequence, threshold: int) -> list[int]:
    """:func:`reconstruct_many` with holder ``k``'s shares of all m secrets given at once, as an (m ×
    :data:`SHARE_SIZE`) array of big-endian bytes (``shares[k][i]`` encodes secret ``i``'s share at ``xs[k]``).

    Each holder's m shares become one integer with secret ``i`` in its own slot of ``_PACKED_SLOT`` bytes, so
    ``Σ_k λ_k·Y_k`` (Lagrange at 0, as in :func:`reconstruct`) forms every secret's sum in t multiplications of
    long integers instead of t·m small ones; each slot is then reduced mod p.  Same values as
    :func:`reconstruct_many` (the shares must be field elements, as decoded messages' are).
    """
    if len(xs) < threshold or len(shares) < threshold:
        raise ShamirError(f"need at least {threshold} shares to reconstruct, got {min(len(xs), len(shares))}")
    lam = lagrange_coefficients(tuple(xs[:threshold]))
    m, w = np.shape(shares[0])[0], _PACKED_SLOT
    slots = np.zeros((m, w), np.uint8)
    total = 0
    for l, y in zip(lam, shares[:threshold]):
        slots[:, w - SHARE_SIZE:] = y
        total += l * int.from_bytes(slots.tobytes(), "big")
    raw, p = total.to_bytes(m * w, "big"), PRIME
    return [int.from_bytes(raw[i:i + w], "big") % p for i in range(0, m * w, w)]
