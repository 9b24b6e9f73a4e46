"""TEST-ONLY: a site's leaf noise × a factor, for the federated audit's controls (docs/audit.md "Federated").

:class:`fedsbdt.client.site.SiteOptions` ``audit_noise_factor`` (never a flag, a plan key or an environment
variable) reaches here: :func:`scaled_noise` wraps the site's randomness so that every discrete-Gaussian
draw — the leaf-noise shares, drawn ahead — has its scales multiplied by the factor (0: no noise at all),
while the rest (the Poisson subsample, the initial score's Laplace share) is untouched.  A secure site keeps
drawing in child processes (:class:`ScaledIsolatedSampler`), so the scaled run takes the very code path of a
real one.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.audit import ScaledNoise

from .isolated_noise import IsolatedSampler


class ScaledIsolatedSampler(IsolatedSampler):
    """An :class:`IsolatedSampler` whose Gaussian requests are scaled by ``factor`` before the child draws them
    (factor 0: zeros, no child); direct draws in the site process go through :class:`ScaledNoise`."""

    def __init__(self, inner, factor: float) -> None:
        super().__init__(ScaledNoise(inner, factor))
        self.factor = float(factor)

    def draw(self, requests: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        scaled = [(kind, np.asarray(s, dtype=np.float64) * (self.factor if kind == "gaussian" else 1.0))
                  for kind, s in requests]
        if self.factor > 0:
            return super().draw(scaled)
        rest = [i for i, (kind, _) in enumerate(scaled) if kind != "gaussian"]
        drawn = dict(zip(rest, super().draw([scaled[i] for i in rest]))) if rest else {}
        return [drawn[i] if i in drawn else np.zeros(np.shape(s), dtype=np.int64) for i, (_, s) in enumerate(scaled)]

    def describe(self) -> str:
        return self.inner.describe()


def scaled_noise(randomness, factor: float):
    """``randomness`` with its discrete-Gaussian noise × ``factor`` (TEST-ONLY; see the module docstring)."""
    if isinstance(randomness, IsolatedSampler):
        return ScaledIsolatedSampler(randomness.inner, factor)
    return ScaledNoise(randomness, factor)
