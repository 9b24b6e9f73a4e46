"""Release declarations: for every release kind of a plan, the noise the parties draw and the event it costs.

One :class:`Release` per kind (``init``, ``sketch``, ``level``, ``tree``, ``eval``) is the single source of
truth for that kind.  It holds the kind's :class:`Noise` — the per-entry noise scales that every site draws
its share from (one rule: ``client/noise.py`` ``draw_share``) and that the coordinator adds in central
noise mode (one rule: ``common/modes/coordinator.py`` ``central_noise``) — and the
privacy event the site's gate charges (``client/gate.py``), which is *computed from those very scales* and
the records' public sensitivity bounds (:meth:`Noise.event`): a mode cannot state one noise and charge
another.  The plan's statement of ε is checked against the composition of these events
(``check_release_accounting``, common/federation/accounting.py), so the plan, the draws and the
charges are three views of one declaration.

Why: federated DPBoost drew Gaussian level histograms of σ_s while its gate charged each level as an
exponential-mechanism event of ε = 0 (``hp.selection`` read by a separate code path): ε 2.74 charged for a
plan of ε 4 (issue 37, finding 1).

Everything here is pure (no I/O, no randomness); noise scales are per-entry standard deviations (Gaussian)
or Laplace scales b, in the integer (fixed-point) units the parties sum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedsbdt.common.accountant import GaussianEvent, LaplaceEvent, PoissonSampledEvent, compose
from fedsbdt.common.federation.wire import Purpose

#: the kinds of data-carrying releases, and the kind of each round purpose (docs/plugins.md)
KINDS = ("init", "sketch", "level", "tree", "eval")
PURPOSE_KIND = {Purpose.INIT_SCORE: "init", Purpose.SKETCH: "sketch", Purpose.LEVEL: "level", Purpose.TREE: "tree",
                Purpose.EVAL: "eval"}

KINDS = ("init", "sketch", "level", "tree", "eval")


class ReleaseError(ValueError):
    """A release declaration is impossible (a non-positive scale or bound, an unknown kind)."""


@dataclass(frozen=True)
class Touch:
    """Entries of one release that one record changes, all with the same noise ``scale``: together they move by at
    most ``bound`` integer units — in L2 norm for Gaussian noise, in L1 norm for Laplace noise (the record's
    clipped contribution; e.g. one leaf's Hessian sum by ≤ h* units)."""

    scale: float
    bound: float

    def __post_init__(self) -> None:
        for name in ("scale", "bound"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or \
                    not (math.isfinite(v) and v > 0):
                raise ReleaseError(f"{name} = {v!r}: must be a finite positive number")


def gaussian_multiplier(touched: tuple[Touch, ...]) -> float:
    """Noise multiplier z of a Gaussian sum release whose worst-case record changes ``touched``:
    ``1/z² = Σ_j (Δ_j/S_j)²`` (the L2 sensitivity in units of the noise; paper Thm. 16 for the leaves,
    docs/greedy.md for a level's histograms, docs/federated-evaluation.md for the evaluation).  The release is
    then a Gaussian mechanism of noise multiplier z at sensitivity 1 (RDP ``α/(2z²)``)."""
    if not touched:
        raise ReleaseError("a Gaussian release must touch at least one entry")
    return 1.0 / math.sqrt(sum((t.bound / t.scale) ** 2 for t in touched))


def laplace_epsilon(touch: Touch) -> float:
    """ε of a Laplace release of scale b on entries a record moves by ≤ Δ in L1 norm: ``Δ/b`` (Dwork et al. 2006,
    Thm. 1; the discrete Laplace the sites draw: paper Thm. 18)."""
    return touch.bound / touch.scale


class Noise:
    """The noise of one release kind, as the parties draw it, and the event derived from it."""

    #: "gaussian" (discrete Gaussian) or "laplace" (discrete Laplace)
    mechanism: ClassVar[str] = "gaussian"
    #: distributed noise: True — every site adds a share of variance 1/k of the full noise (tree, level and sketch
    #: rounds; k = the plan's noise divisor); False — every site adds the full noise (initial score, evaluation)
    split: ClassVar[bool] = True
    #: central noise mode: True — the coordinator adds the full noise to the sum (a site adds a full share only to
    #: a retry, so two attempts never difference to its exact sums); False — every site adds its full share in
    #: either mode (the evaluation: each site's vector is ε_eval-DP on its own)
    central: ClassVar[bool] = True

    def scales(self, shares: int = 1, **where) -> np.ndarray:
        """Per-entry scale of one of ``shares`` shares of this release's noise (``shares`` = 1: the full noise;
        ignored where :attr:`split` is False).  ``where``: what fixes the vector's layout (tree, level, …)."""
        raise NotImplementedError

    def touched(self) -> tuple[Touch, ...]:
        """What the worst-case record changes, with the full noise scale of those entries (taken from
        :meth:`scales`)."""
        raise NotImplementedError

    def multiplier(self) -> float:
        """Gaussian noise: the noise multiplier z (:func:`gaussian_multiplier` of :meth:`touched`)."""
        return gaussian_multiplier(self.touched())

    def event(self):
        """The accountant event of one release of this noise for the worst-case record it reads."""
        if self.mechanism == "gaussian":
            return GaussianEvent(self.multiplier())
        return compose(*(LaplaceEvent(laplace_epsilon(t)) for t in self.touched()))


@dataclass(frozen=True)
class Release:
    """One release kind of a plan: its noise, the Poisson subsampling of its input set, and what it is charged.

    ``rate``: the release reads a Poisson subsample of rate γ of its input set (None: every record of it).
    ``composed``: releases on the *same* subsample composed into this one's event and charged with it, as
    ``(noise, count)`` pairs (a Sarus tree's levels and leaves, charged with its sketch).  ``charged_with``:
    this release's cost is part of the event of that kind (its own event is None).
    """

    kind: str
    noise: Noise
    rate: float | None = None
    composed: tuple = ()
    charged_with: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ReleaseError(f"unknown release kind {self.kind!r} (kinds: {', '.join(KINDS)})")
        if not isinstance(self.noise, Noise):
            raise ReleaseError(f"the {self.kind} release's noise must be a Noise, not {self.noise!r}")
        if self.rate is not None and not (isinstance(self.rate, (int, float)) and 0 < self.rate <= 1):
            raise ReleaseError(f"the {self.kind} release's subsampling rate must be in (0, 1], got {self.rate!r}")
        for part in self.composed:
            if not (isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], Noise)
                    and isinstance(part[1], int) and part[1] >= 1):
                raise ReleaseError(f"the {self.kind} release composes (noise, count ≥ 1) pairs, not {part!r}")
        if self.charged_with is not None and (self.composed or self.rate is not None):
            raise ReleaseError(f"the {self.kind} release is charged with {self.charged_with!r}: it has no event of "
                               "its own to subsample or compose")
        if self.composed and self.noise.mechanism != "gaussian":
            raise ReleaseError("only Gaussian releases compose under one subsample (their RDP is linear in α)")

    @property
    def event(self):
        """The event one data-carrying release of this kind costs a worst-case record it reads (None: nothing,
        it is part of the ``charged_with`` kind's event)."""
        if self.charged_with is not None:
            return None
        ev = self.noise.event()
        if self.composed:
            ev = compose(ev, *(compose(n.event(), count=c) for n, c in self.composed))
        return ev if self.rate is None else PoissonSampledEvent(float(self.rate), ev)

    def scales(self, shares: int = 1, **where) -> np.ndarray:
        """The per-entry noise scales of one of ``shares`` shares (what a site draws; ``shares`` = 1: the full
        noise the coordinator adds in central noise mode)."""
        return self.noise.scales(shares, **where)


# --------------------------------------------------------------------------- the noises of the built-in modes


@dataclass(frozen=True)
class LeafNoise(Noise):
    """S-BDT's leaf-balanced Gaussian (paper Thm. 16, Alg. 5): a tree's ``[Hessian | gradient]`` leaf sums; a
    record changes one leaf's Hessian sum by ≤ h* and its gradient sum by ≤ g* (multi-class: one leaf of each
    of the K class trees, jointly ≤ H and G in L2, common/multiclass.py).  Random, greedy and DPBoost leaves
    (DPBoost's counts enter as h* units per record, common/modes/dpboost/rounds.py)."""

    hp: object  # Hyperparameters
    enc: object  # Encoding
    sigma: float

    def scales(self, shares: int = 1, **where) -> np.ndarray:
        from fedsbdt.common.boosting import leaf_noise_scales

        return leaf_noise_scales(self.hp, self.enc, self.sigma, shares=shares)

    def touched(self) -> tuple[Touch, ...]:
        s, L, enc = self.scales(), self.hp.leaves, self.enc
        if enc.classes > 1:
            from fedsbdt.common.multiclass import gradient_sensitivity, hessian_sensitivity

            H = hessian_sensitivity(enc.classes, enc.hess.bound_units, enc.scale)
            G = gradient_sensitivity(enc.classes, enc.grad.bound_units, enc.scale)
        else:
            H, G = enc.hess.bound_units, enc.grad.bound_units
        return Touch(float(s[0]), float(H)), Touch(float(s[L]), float(G))


@dataclass(frozen=True)
class LevelNoise(Noise):
    """A greedy (or DPBoost) level's noisy histograms ``[gradient | count]`` on the plan's grid (docs/greedy.md):
    a record lies in one node and, per carried feature, in one bin — F gradient entries (≤ g* each) and F count
    entries (≤ 1 each).  ``where``: ``tree`` and ``level`` (the layout)."""

    grid: object  # fedsbdt.common.modes.greedy.rounds.GreedyGrid
    grad_units: int
    sigma: float

    def scales(self, shares: int = 1, tree: int = 0, level: int = 0, **where) -> np.ndarray:
        return self.grid.noise_scales(int(tree), int(level), self.grad_units, self.sigma, shares)

    def touched(self) -> tuple[Touch, ...]:
        s = self.scales()
        F = self.grid.layout(0, 0).features.size
        return Touch(float(s[0]), math.sqrt(F) * self.grad_units), Touch(float(s[-1]), math.sqrt(F))


@dataclass(frozen=True)
class InitNoise(Noise):
    """The initial score's discrete Laplace (paper Alg. 3, Thm. 18): ``[count, label sum]`` (multi-class
    ``[N, n_0 … n_{K−1}]``); a record changes the label sum by ≤ m* units (or one class count by 1) and the
    count by 1.  Every site adds a full share (a Laplace variable does not split into integer shares,
    docs/privacy.md)."""

    mechanism: ClassVar[str] = "laplace"
    split: ClassVar[bool] = False
    hp: object
    enc: object
    cal: object  # PrivacyCalibration

    def scales(self, shares: int = 1, **where) -> np.ndarray:
        from fedsbdt.common.boosting import init_noise_scales

        return init_noise_scales(self.hp, self.enc, self.cal)

    def touched(self) -> tuple[Touch, ...]:
        s = self.scales()
        label = 1.0 if self.enc.classes > 1 else float(self.enc.label.bound_units)
        return Touch(float(s[1]), label), Touch(float(s[0]), 1.0)  # (ε_init, ε_ds): the accountant's order


@dataclass(frozen=True)
class EvalNoise(Noise):
    """The federated evaluation's histograms (common/fed_eval.py): every site adds a full share of scale
    ``S_j = √m·σ·Δ_j``, so its vector is ε_eval-DP on its own (docs/federated-evaluation.md)."""

    split: ClassVar[bool] = False
    central: ClassVar[bool] = False
    spec: object  # fedsbdt.common.fed_eval.EvalSpec

    def scales(self, shares: int = 1, **where) -> np.ndarray:
        return self.spec.noise_scales()

    def touched(self) -> tuple[Touch, ...]:
        """The worst record's coordinates whitened by their scales: ``√Σ_j (Δ_j/S_j)²`` over :meth:`scales`
        (``EvalSpec.normalised_sensitivity``: one count of each histogram it enters and every clipped sum)."""
        return (Touch(1.0, self.spec.normalised_sensitivity()),)


@dataclass(frozen=True)
class SketchNoise(Noise):
    """A Sarus tree's sketch (docs/sarus.md "Federation"): per numeric feature the count of the subsample's
    records in every fine bin, in units of C; a record adds C to one bin of each of the m numeric features."""

    grid: object  # fedsbdt.common.modes.sarus.rounds.SarusGrid
    sigma: float

    def scales(self, shares: int = 1, **where) -> np.ndarray:
        return self.grid.sketch_noise_scales(self.sigma, shares)

    def touched(self) -> tuple[Touch, ...]:
        m = self.grid.numeric.size
        return (Touch(float(self.scales()[0]), math.sqrt(m) * self.grid.count_units),) if m else ()

    def multiplier(self) -> float:
        if self.grid.numeric.size:
            return gaussian_multiplier(self.touched())
        # no numeric feature: the sketch is empty, but the plan's calibration budgets its share of every tree
        # all the same (docs/sarus.md); charged at the value the scales give for any m ≥ 1, √m·C/S = √2/σ_k
        return self.sigma / math.sqrt(2.0)


@dataclass(frozen=True)
class SarusLevelNoise(Noise):
    """A Sarus level's ``[gradient | count]`` histograms on the tree's grid (from its released sketch) or, with
    ``leaves``, the leaves ``[gradient | count]`` (one bin per leaf); counts in units of C.  A record changes
    one bin per feature: ≤ g* units in a gradient entry and C in a count entry.  ``where``: ``layout`` (the
    level's :class:`~fedsbdt.common.modes.greedy.levels.LevelLayout` on the tree's grid)."""

    grid: object  # SarusGrid
    grad_units: int
    sigma: float
    leaves: bool = False

    def scales(self, shares: int = 1, layout=None, **where) -> np.ndarray:
        if self.leaves:
            return self.grid.leaf_noise_scales(self.grad_units, self.sigma, shares)
        if layout is None:  # the widest layout: one node, every feature in one bin (the scales do not depend on it)
            from fedsbdt.common.modes.greedy.levels import LevelLayout

            m = self.grid.is_cat.size
            layout = LevelLayout(1, np.arange(m), np.ones(m, np.int64), self.grid.is_cat)
        return self.grid.level_noise_scales(layout, self.grad_units, self.sigma, shares)

    def touched(self) -> tuple[Touch, ...]:
        s = self.scales()
        F = 1 if self.leaves else self.grid.is_cat.size
        return (Touch(float(s[0]), math.sqrt(F) * self.grad_units),
                Touch(float(s[-1]), math.sqrt(F) * self.grid.count_units))
