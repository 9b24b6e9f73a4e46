"""Individual Rényi filter tables (paper Alg. 1, Thm. 11, Thm. 19, §8.1).

A record with clipped gradient g and Hessian h costs, in one round,
``ρ_t = a_γ(α̂, α̂·(r1·h²/h*² + r2·g²/g*²)/σ²)`` (Thm. 19).  As the paper
does (§8.1), |g| and h are rounded *up* to a grid — here ``K`` steps of each
clip bound, in exact integer arithmetic — and the cost is precomputed for
every grid cell.  Costs are stored in integer *ledger units*: the worst-case
cost of one round is exactly ``UNITS_PER_ROUND`` units, every other cell is
rounded up, and the budget ρ(α̂) = T_regular · worst-case cost is exactly
``T_regular · UNITS_PER_ROUND``.  Integer ledgers never drift, so a worst-case
record takes part in exactly T_regular rounds and no record can exceed ρ(α̂).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .accountant import subsampled_rdp

UNITS_PER_ROUND = 2**30
DEFAULT_GRID = 64


@dataclass(frozen=True)
class FilterTable:
    alpha: int
    sigma: float
    gamma: float
    r1: float
    grid: int
    cost_units: np.ndarray  # (grid+1, grid+1) int64, indexed [kh, kg]
    budget_units: int  # T_regular · UNITS_PER_ROUND
    unit_rdp: float  # RDP of one ledger unit (worst-case round cost / UNITS_PER_ROUND)

    def units_to_rdp(self, units: np.ndarray | int) -> np.ndarray | float:
        return np.asarray(units, dtype=np.float64) * self.unit_rdp


@lru_cache(maxsize=32)
def filter_table(alpha: int, sigma: float, gamma: float, r1: float, regular_rounds: int,
                 grid: int = DEFAULT_GRID) -> FilterTable:
    """Precompute the per-cell round cost (Thm. 19) in ledger units, rounded up."""
    k = np.arange(grid + 1, dtype=np.float64) / grid
    c = r1 * k[:, None] ** 2 + (1.0 - r1) * k[None, :] ** 2  # [kh, kg]
    rdp = subsampled_rdp(int(alpha), float(gamma), c.ravel() / sigma**2).reshape(c.shape)
    worst = float(rdp[grid, grid])
    if not worst > 0:
        raise ValueError("the worst-case round cost is zero; check σ and γ")
    units = np.minimum(np.ceil(rdp / worst * UNITS_PER_ROUND * (1 + 1e-9)), UNITS_PER_ROUND).astype(np.int64)
    units[grid, grid] = UNITS_PER_ROUND
    units = np.maximum.accumulate(np.maximum.accumulate(units, axis=0), axis=1)  # monotone in |g| and h
    return FilterTable(int(alpha), float(sigma), float(gamma), float(r1), int(grid), units,
                       int(regular_rounds) * UNITS_PER_ROUND, worst / UNITS_PER_ROUND)




def exhausted_share(spent: np.ndarray, table: FilterTable) -> float:
    """Share of records that can no longer afford a worst-case round (the site's own, private statistic)."""
    spent = np.asarray(spent, dtype=np.int64)
    if spent.size == 0:
        return 0.0
    return float(np.mean(spent > table.budget_units - UNITS_PER_ROUND))
