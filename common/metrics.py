"""Evaluation metrics (pure numpy): RMSE, exact ROC AUC (ties counted half), accuracy."""
from __future__ import annotations

import numpy as np


def rmse(y: np.ndarray, pred: np.ndarray) -> float:
    y, pred = np.asarray(y, float), np.asarray(pred, float)
    return float(np.sqrt(np.mean((y - pred) ** 2)))


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve by the Mann–Whitney statistic with mid-ranks for ties."""
    y = np.asarray(y, float)
    score = np.asarray(score, float)
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    mid = upper - (counts - 1) / 2.0  # mid-rank of each distinct score
    r = mid[inverse]
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def accuracy(y: np.ndarray, prob: np.ndarray, threshold: float = 0.5) -> float:
    return float(np.mean((np.asarray(prob) >= threshold) == (np.asarray(y) == 1)))
