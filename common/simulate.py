"""The simulated interaction problems of "Revisiting DP-XGBoost" (§6.1, Appendix C.2.1).

Three Gaussian features ``X1 ~ N(1, 25)``, ``X2 ~ N(−5, 8)``, ``X3 ~ N(−2, 7)``
and a label ``1{sigmoid(F(x)) > 0.5} = 1{F(x) > 0}`` where F holds the
two- and three-way interactions (problem 1) plus the main effects
(problem 2), projected onto [−12, 12].  Models see only the three features.
The public ranges are the means ± 5 standard deviations (values outside
are clipped to them).  For tests and benchmarks: synthetic, no real records.
"""
from __future__ import annotations

import math

import numpy as np

from .data import Dataset
from .schema import Schema

MEANS = (1.0, -5.0, -2.0)
STDS = (5.0, math.sqrt(8.0), math.sqrt(7.0))


def interaction_schema() -> Schema:
    return Schema.from_dict({
        "name": "interactions", "task": "binary", "target": "y", "columns": ["x1", "x2", "x3", "y"],
        "features": [{"name": f"x{i + 1}", "type": "numeric", "range": [m - 5 * s, m + 5 * s]}
                     for i, (m, s) in enumerate(zip(MEANS, STDS))]})


def interaction_labels(X: np.ndarray, problem: int = 1) -> np.ndarray:
    """``1{F(x) > 0}`` with Appendix C.2.1's F for ``problem`` 1 (interactions only) or 2 (plus main effects)."""
    if problem not in (1, 2):
        raise ValueError("problem must be 1 or 2")
    x1, x2, x3 = X[:, 0], X[:, 1], X[:, 2]
    F = x1 * x2 + x1 * x3 + x2 * x3 + x1 * x2 * x3
    if problem == 2:
        F = F + x1 + x2 + x3
    return (np.clip(F, -12.0, 12.0) > 0).astype(np.float64)


def interaction_problem(rng: np.random.Generator, n: int = 10_000, problem: int = 1) -> Dataset:
    """``n`` records of the simulated problem (features clipped to the public ranges)."""
    X = np.column_stack([rng.normal(m, s, n) for m, s in zip(MEANS, STDS)])
    X = np.clip(X, [m - 5 * s for m, s in zip(MEANS, STDS)], [m + 5 * s for m, s in zip(MEANS, STDS)])
    return Dataset.from_arrays(X, interaction_labels(X, problem), interaction_schema())
