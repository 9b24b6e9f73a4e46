"""A site's part of the federated evaluation (docs/federated-evaluation.md): checks and its noisy vector.

The math is in :mod:`fedsbdt.common.fed_eval`; this module is the glue the site
machine calls:

* :func:`load_held_out` — at plan acceptance: the held-out file must match the
  plan's schema and its public record bound;
* :func:`check_request` — at an evaluation RoundStart: the pinned plan must
  declare an evaluation, the vector length must be the plan's, every tree of
  the plan must be applied;
* :func:`eval_input` — the vector and noise: the histogram of the released
  model's predictions on the held-out records plus one full discrete-Gaussian
  share of scale ``√m·σ_eval·Δ_j``.  It is drawn **once**: the first attempt
  stores it in the site database (with the charge record) and every retry of
  the evaluation round resends the identical vector, so however often the
  round is retried, one ε_eval release is made about the held-out file.

A site without a held-out file contributes an all-zero vector plus its noise
share: it keeps the round's t-of-n secure aggregation going without adding
records.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from fedsbdt.common.data import DataError, Dataset

from .dataload import load_isolated
from .noise import draw_share


def load_held_out(path: Path, plan) -> Dataset:
    """Parse the held-out file with the plan's schema; ``ValueError`` with one sentence if it cannot be used."""
    try:
        ds = load_isolated(path, plan.schema)
    except DataError as e:
        raise ValueError(f"the held-out data (--eval-data) does not match the plan's schema: {e}") from None
    if ds.n > plan.max_records_per_site:
        raise ValueError(f"{path} holds {ds.n} held-out records, more than the plan's public bound "
                         f"max_records_per_site = {plan.max_records_per_site}")
    return ds


def check_request(plan, vector_len: int, trees_applied: int, has_init: bool) -> str | None:
    """Why this site refuses an evaluation round of ``vector_len`` (one sentence), or None to take part."""
    spec = plan.eval_spec
    if spec is None:
        return "the pinned plan declares no federated evaluation ([evaluation] section); refusing to evaluate"
    if vector_len != spec.length:
        return (f"vector length {vector_len}, but the plan's evaluation ({spec.task}, {spec.bins} bins) has "
                f"{spec.length} entries")
    total = plan.hyperparameters.total_rounds
    if not has_init or trees_applied != total:
        return f"evaluation requested after {trees_applied} of the plan's {total} trees; refusing"
    return None


def eval_input(plan, model, held_out: Dataset | None, randomness) -> tuple[np.ndarray, np.ndarray, dict]:
    """(vector, noise, charge record) of this site's evaluation contribution, drawn once (see module doc)."""
    spec = plan.eval_spec
    if held_out is None or held_out.n == 0:
        x = np.zeros(spec.length, dtype=np.int64)
        n, digest = 0, None
    else:
        x = spec.histogram(held_out.y, model.predict(held_out.X))
        n = int(held_out.n)
        digest = hashlib.sha256(np.ascontiguousarray(held_out.ids, dtype=np.int64).tobytes()).hexdigest()
    noise = np.asarray(draw_share(plan, plan.releases["eval"], randomness, participants=None, retry=False),
                       dtype=np.int64)  # the declared noise, by the site's one noise rule
    charge = {"epsilon_eval": float(spec.epsilon), "delta_eval": float(spec.delta), "sigma_eval": spec.sigma,
              "records": n, "record_ids_sha256": digest}
    return x, noise, charge
