"""The one-run audit of a federation (``fedsbdt audit --sites N``; docs/audit.md "Federated").

The same audit as the central one (:mod:`fedsbdt.common.audit`: Steinke, Nasr & Jagielski 2023), with the
training run a federation: the auditor's canaries (each in by a secret fair coin) are placed at **one site**
(``site-1``), every other record is dealt round-robin to the N sites, and N sites and a coordinator train
through the federation's own state machines (:mod:`fedsbdt.inprocess`: each site's Poisson subsample,
its discrete-Gaussian noise share of variance σ²/k_r, secure aggregation; the coordinator sees only the noisy
sum).  The released model is scored exactly as central (:func:`fedsbdt.common.audit.canary_scores` with every
real record and the canaries), and (m, r, v) become ε_lower by the same bound.

What this adds to the central audit: the noise that protects the canary site's records is no longer drawn in
one place, but as N shares by N processes' samplers (or by the coordinator, central noise), each scaled by the
plan's divisor k_r.  A share drawn at the wrong scale, a site that loses its share, a divisor computed wrongly
or a mask that cancels the noise all leave the canary site's sums under-noised, and the audit sees it.

The test-only noise switch (``_noise_factor``) multiplies every site's leaf-noise share (and, central noise,
the coordinator's noise); the plan and the receipt still state the claimed ε.  It reaches the sites through
:class:`fedsbdt.client.site.SiteOptions` ``audit_noise_factor``, which no command line flag sets.
"""
from __future__ import annotations

import time

import numpy as np

from fedsbdt.common.audit import AuditError, AuditResult

#: the site that holds the canaries (site ids are ``site-1`` … ``site-N``)
CANARY_SITE = "site-1"


def deal(n: int, sites: int) -> list[np.ndarray]:
    """Record indices of each of ``sites`` sites: record i goes to site ``i mod sites`` (round-robin)."""
    if isinstance(sites, bool) or not isinstance(sites, int) or sites < 2:
        raise AuditError(f"--sites {sites!r}: a federation needs at least 2 sites")
    if n < sites:
        raise AuditError(f"{n} records cannot be dealt to {sites} sites (at least one each)")
    idx = np.arange(n)
    return [idx[k::sites] for k in range(sites)]


def run_federated_audit(dataset, hp, sites: int, canaries: int = 1000, confidence: float = 0.95, progress=None,
                        sampler: str = "ours", *, workdir=None,
                        _noise_factor: float = 1.0) -> tuple[AuditResult, object]:
    """Draw canaries, place the "in" ones at :data:`CANARY_SITE`, deal the data to ``sites`` sites, train by an
    in-process federation (distributed noise, secure randomness), score the canaries from the released model
    and return the verdict and the model.

    ``_noise_factor`` is TEST-ONLY (the negative control and the planted noise-losing bug of the tests and
    ``benchmarks/audit.py``); the command line never sets it."""
    from fedsbdt.common.audit import (audit_hyperparameters, canary_scores, check_audit_inputs, draw_canaries,
                                      result_from_scores, with_canaries)

    from .inprocess import InProcessSetup, train_in_process

    check_audit_inputs(dataset, confidence)
    parts = deal(dataset.n, sites)
    hp = audit_hyperparameters(hp)
    setup = InProcessSetup(sampler=sampler, noise_factor=_noise_factor)  # validates the factor first
    t0 = time.perf_counter()
    can = draw_canaries(dataset.schema, canaries)
    site_data = [dataset.subset(p) for p in parts]
    site_data[0] = with_canaries(site_data[0], can)
    model = train_in_process(site_data, hp, setup, progress=progress, workdir=workdir)
    scores = canary_scores(model, dataset.X, dataset.y, can)
    result = result_from_scores(scores, can, model.privacy["epsilon"], model.privacy["delta"], confidence,
                                mode="federated", sites=sites, trees=len(model.trees), rows=dataset.n,
                                seconds=round(time.perf_counter() - t0, 3),
                                extra={"canary_site": CANARY_SITE, "noise_mode": model.privacy["noise_mode"],
                                       "site_rows": [int(p.size) for p in parts]})
    return result, model


def register(sub) -> None:
    """Give ``fedsbdt audit`` (registered by :mod:`fedsbdt.common.cli_audit`) its federated runner: the common
    layer never imports this one, it calls what the parser carries."""
    audit = sub.choices.get("audit")
    if audit is not None:
        audit.set_defaults(federated_audit=run_federated_audit)
