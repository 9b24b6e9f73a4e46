"""Fixed-point codec over the ring Z_{2^64} (secagg.md, "Encoding and primitives").

Every value that is summed across records or sites — clipped gradients,
clipped Hessians, clipped labels, record counts — is first encoded as an
integer ``q = rint(clip(x, ±B) · S)``.  Sums of such integers are exact and
order-independent, so a federated sum over sites equals the centralised sum
bit for bit, and DP noise can be drawn from an exact *discrete* Gaussian in the
same integer units.

Secure aggregation works in Z_{2^64}: an int64 vector is viewed as uint64
(wrapping silently), masked, summed and unmasked; the int64 view of the ring
sum is the true integer sum as long as it cannot overflow, which
:func:`check_capacity` guarantees before a session starts.

All functions are pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Default scale: 2^20 fixed-point units per 1.0.
DEFAULT_SCALE_BITS = 20

_I63 = 2**63


class FixedPointError(ValueError):
    """An input or a sum does not fit the agreed fixed-point bound."""


@dataclass(frozen=True)
class FixedPointCodec:
    """Encode reals in ``[-bound, bound]`` as integers with ``2**scale_bits`` units per 1.0.

    ``bound`` is the largest magnitude one *record* may contribute to one
    coordinate (for example the gradient clip g*).  ``bound_units`` is the same
    bound in integer units and is exactly the L∞ sensitivity of a sum.
    """

    bound: float
    scale_bits: int = DEFAULT_SCALE_BITS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise FixedPointError(f"fixed-point bound must be a positive finite number, got {self.bound!r}")
        if not (0 <= self.scale_bits <= 40):
            raise FixedPointError(f"scale_bits must be in [0, 40], got {self.scale_bits}")
        if self.bound_units >= 2**53:
            raise FixedPointError(
                f"bound·scale = {self.bound}·2^{self.scale_bits} must stay below 2^53 (float exactness)"
            )
        if self.bound_units < 1:
            raise FixedPointError(f"bound {self.bound} is below one fixed-point unit 2^-{self.scale_bits}")

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    @property
    def bound_units(self) -> int:
        """Integer clip bound ``round(B·S)``: the sensitivity of a sum in units."""
        return int(round(self.bound * self.scale))

    def encode(self, x: np.ndarray) -> np.ndarray:
        """``clip(rint(x·S), ±round(B·S))`` as int64; NaN is refused."""
        x = np.asarray(x, dtype=np.float64)
        if np.isnan(x).any():
            raise FixedPointError("cannot encode NaN")
        b = self.bound_units
        return np.clip(np.rint(x * self.scale), -b, b).astype(np.int64)

    def decode(self, q: np.ndarray) -> np.ndarray:
        """Integer (sum) in units back to float64."""
        return np.asarray(q, dtype=np.int64).astype(np.float64) / self.scale

    def check_bounded(self, q: np.ndarray, max_terms: int = 1) -> None:
        """Refuse a vector whose entries could not come from ``max_terms`` clipped records."""
        q = np.asarray(q, dtype=np.int64)
        limit = self.bound_units * int(max_terms)
        if q.size and int(np.abs(q).max()) > limit:
            raise FixedPointError(
                f"fixed-point value {int(np.abs(q).max())} exceeds the agreed bound {limit} "
                f"({max_terms} terms of at most {self.bound} each)"
            )


def to_ring(q: np.ndarray) -> np.ndarray:
    """View an int64 vector as an element of Z_{2^64}^d (uint64, two's complement)."""
    return np.ascontiguousarray(q, dtype=np.int64).view(np.uint64)


def from_ring(r: np.ndarray) -> np.ndarray:
    """The int64 (signed) view of a ring element."""
    return np.ascontiguousarray(r, dtype=np.uint64).view(np.int64)


def noise_tail(sigma_units: float, tail_sigmas: float = 40.0) -> int:
    """A bound that a discrete Gaussian with std ``sigma_units`` exceeds with probability < 1e-300."""
    return int(math.ceil(tail_sigmas * sigma_units)) + 1


def check_capacity(max_abs_sum: int, n_terms: int, noise_sigma_units: float = 0.0) -> None:
    """Refuse a configuration whose worst-case ring sum could wrap around 2^63.

    ``max_abs_sum`` bounds one party's noiseless contribution, ``n_terms`` is
    the number of parties and ``noise_sigma_units`` the standard deviation of
    one party's noise share (secagg.md: ``n·(B·S + noise tail) < 2^63``).
    """
    total = int(n_terms) * (int(max_abs_sum) + noise_tail(noise_sigma_units))
    if total >= _I63:
        raise FixedPointError(
            f"{n_terms} terms of up to {max_abs_sum} units plus noise could overflow the 64-bit ring; "
            "lower the fixed-point scale or the clip bounds"
        )
