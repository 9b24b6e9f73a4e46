"""Typed, validated hyperparameters (design.md "Session" and "Command line").

Every field name is the plan key; the CLI flag is the same name with ``-``
(``grad_clip`` ↔ ``--grad-clip``).  Validation happens in ``__post_init__`` so
an invalid object cannot exist.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from fedsbdt.common import modes

TASKS = ("regression", "binary", "multiclass")
#: Exact DP-noise samplers (common/randomness.py): our own (default) or OpenDP's.
SAMPLERS = ("ours", "opendp")
SELECTIONS = ("exponential", "histogram")  # how greedy trees choose splits (docs/greedy.md)
#: where numeric split candidates come from (docs/data-sources.md#split-candidates): the schema (equidistant
#: unless it declares ``scale`` or ``cuts``; no privacy cost), or DP quantiles of the records (central random
#: trees; ``candidate_share`` of ε)
CANDIDATE_PLACEMENTS = ("schema", "quantile")
#: keys left out of :meth:`Hyperparameters.to_dict` at these values, so plans and models without DP quantile
#: candidates stay byte for byte what they were
_QUIET_DEFAULTS = {"candidate_placement": "schema", "candidate_share": 0.05}
MAX_DEPTH = 12  # 2·2^12 fixed-point values per round: well inside the gRPC message limit


class ConfigError(ValueError):
    """A hyperparameter or plan value is missing or out of range."""


@dataclass(frozen=True)
class Hyperparameters:
    """S-BDT hyperparameters (paper Table 1).  ``None`` clip values take the task's default."""

    epsilon: float = 1.0  # total ε of the released model (initial score + trees)
    delta: float = 5e-8  # δ
    trees: int = 100  # T_regular (accounted rounds)
    extra_trees: int = 0  # T_extra (free with the filter; accounted without it)
    depth: int = 3  # d
    subsample: float = 0.1  # γ, Poisson rate
    learning_rate: float = 0.1  # η
    l2: float = 1.0  # λ
    leaf_clip: float = 2.0  # β
    grad_clip: float = 0.5  # g*
    hess_clip: float | None = None  # h*: regression 1.0, binary 0.25
    label_clip: float = 1.0  # m*
    r1: float = 0.2  # Hessian share of the leaf noise (r2 = 1 − r1)
    init_share: float = 0.1  # ε_init / ε (0 disables the initial score)
    eps_ds: float = 0.005  # ε for the dataset size of the initial score
    accountant: str = "rdp"  # "rdp" (paper, supports the filter) or "pld" (dp-accounting, tighter)
    filter: bool = False  # individual Rényi filter (Alg. 1)
    # defaults chosen by benchmarks/defaults.py (docs/choosing-epsilon.md "Split settings"); off when features interact
    cyclical: bool = True  # cyclical feature interactions (Nori et al.)
    split_candidates: int = 32  # N equidistant thresholds; 0 = thresholds uniform over the public range
    seed: int | None = None  # public randomness (splits only)
    scale_bits: int = 20  # fixed-point scale 2^scale_bits
    tree_builder: str = modes.DEFAULT  # a registered tree builder (common/modes/, docs/plugins.md)
    selection_share: float = 0.7  # greedy: share of the trees' zCDP budget for node selection (rest: leaves)
    selection: str = "exponential"  # greedy: exponential mechanism, or arg max of noisy level histograms
    sketch_share: float = 0.0  # greedy: share for the adaptive Hessian sketch (0 = the uniform grid; paper 0.1)
    ensemble_trees: int = 0  # dpboost: T_e, trees per ensemble (0 = all trees in one ensemble)
    min_child_weight: int = 0  # sarus: N, the child weight clamp of gains and leaves (docs/sarus.md)
    candidate_placement: str = "schema"  # numeric split candidates: the schema's, or DP "quantile"s of the records
    candidate_share: float = 0.05  # quantile: ε_c/ε for the histograms (benchmarks/split_candidates.py: 0.05 > 0.1)

    def __post_init__(self) -> None:
        """The checks every tree builder shares, then the mode's own (``Mode.check_hyperparameters`` of the
        registered mode ``tree_builder`` names; an unknown name is refused listing the registered ones)."""
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"{name} = {getattr(self, name)!r}: {why}")

        self._check_types(bad)
        try:
            mode = modes.tree_builder(self.tree_builder)
        except modes.UnknownMode as e:
            raise ConfigError(f"tree_builder = {self.tree_builder!r}: {e}") from None
        if not isinstance(self.selection, str) or self.selection not in SELECTIONS:
            raise bad("selection", "must be 'exponential' or 'histogram'")
        self._check_ranges(bad)
        if self.init_share > 0 and self.init_share * self.epsilon + self.eps_ds >= self.epsilon:
            raise ConfigError(
                f"the initial score would use ε_init + ε_ds = {self.init_share * self.epsilon + self.eps_ds:g} "
                f"of the total ε = {self.epsilon:g}, leaving nothing for the trees; lower init_share or eps_ds"
            )
        accountants = sorted({a for m in modes.tree_builders().values() for a in m.accountants})
        if self.accountant not in accountants:
            raise bad("accountant", f"must be one of {', '.join(map(repr, accountants))}")
        if self.accountant == "pld" and self.filter:
            raise ConfigError("the individual Rényi filter needs the RDP accountant (accountant = 'rdp')")
        mode.check_hyperparameters(self, bad)

    def _check_types(self, bad) -> None:
        for name in ("epsilon", "delta", "subsample", "learning_rate", "l2", "leaf_clip", "grad_clip",
                     "label_clip", "r1", "init_share", "eps_ds", "selection_share", "sketch_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        if self.hess_clip is not None and (not isinstance(self.hess_clip, (int, float)) or not self.hess_clip > 0):
            raise bad("hess_clip", "must be a positive number")
        for name in ("trees", "extra_trees", "depth", "split_candidates", "scale_bits", "ensemble_trees",
                     "min_child_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, "must be an integer")
        for name in ("filter", "cyclical"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")
        if not isinstance(self.accountant, str):
            raise bad("accountant", "must be 'rdp' or 'pld'")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", "must be a non-negative integer")

    def _check_ranges(self, bad) -> None:
        if not self.epsilon > 0:
            raise bad("epsilon", "must be > 0")
        if not 0 < self.delta < 1:
            raise bad("delta", "must be in (0, 1)")
        if self.trees < 1:
            raise bad("trees", "must be ≥ 1")
        if self.extra_trees < 0:
            raise bad("extra_trees", "must be ≥ 0")
        if not 1 <= self.depth <= MAX_DEPTH:
            raise bad("depth", f"must be in 1..{MAX_DEPTH}")
        if not 0 < self.subsample <= 1:
            raise bad("subsample", "γ must be in (0, 1]")
        if not self.learning_rate > 0:
            raise bad("learning_rate", "must be > 0")
        if not self.l2 >= 0:
            raise bad("l2", "must be ≥ 0")
        for name in ("leaf_clip", "grad_clip", "label_clip"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if not 0 < self.r1 < 1:
            raise bad("r1", "the Hessian noise share must be in (0, 1)")
        if not 0 <= self.init_share < 1:
            raise bad("init_share", "ε_init/ε must be in [0, 1)")
        if not self.eps_ds > 0:
            raise bad("eps_ds", "must be > 0")
        if self.split_candidates < 0:
            raise bad("split_candidates", "must be ≥ 0")
        self._check_placement(bad)
        if not 8 <= self.scale_bits <= 30:
            raise bad("scale_bits", "must be in 8..30")

    def _check_placement(self, bad) -> None:
        """DP quantile candidates (docs/data-sources.md#split-candidates): random trees, a grid, a budget left."""
        v = self.candidate_share
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise bad("candidate_share", "ε_c/ε must be a number in (0, 1)")
        if not isinstance(self.candidate_placement, str) or self.candidate_placement not in CANDIDATE_PLACEMENTS:
            raise bad("candidate_placement", "must be 'schema' or 'quantile'")
        if self.candidate_placement != "quantile":
            return
        if not modes.tree_builder(self.tree_builder).public_splits:
            raise bad("candidate_placement", "DP quantile candidates are for random trees (S-BDT's public random "
                      "splits)")
        if not 1 <= self.split_candidates <= 255:
            raise bad("candidate_placement", "DP quantile candidates need split_candidates in 1..255")
        used = self.candidate_share * self.epsilon + (self.init_share * self.epsilon + self.eps_ds
                                                      if self.init_share > 0 else 0.0)
        if used >= self.epsilon:
            raise ConfigError(f"the quantile candidates and the initial score would use {used:g} of the total "
                              f"ε = {self.epsilon:g}, leaving nothing for the trees; lower candidate_share")

    @property
    def eps_candidates(self) -> float:
        """ε_c of the DP quantile candidates (0 unless ``candidate_placement = "quantile"``)."""
        return self.candidate_share * self.epsilon if self.candidate_placement == "quantile" else 0.0

    # ------------------------------------------------------------------ derived

    @property
    def r2(self) -> float:
        return 1.0 - self.r1

    @property
    def leaves(self) -> int:
        return 2**self.depth

    @property
    def total_rounds(self) -> int:
        return self.trees + self.extra_trees

    @property
    def accounted_rounds(self) -> int:
        """Rounds the accountant charges: extra rounds are free only with the filter."""
        return self.trees if self.filter else self.trees + self.extra_trees

    def hess_clip_for(self, task: str) -> float:
        if self.hess_clip is not None:
            return float(self.hess_clip)
        return 1.0 if task == "regression" else 0.25

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["candidate_placement"] == _QUIET_DEFAULTS["candidate_placement"]:  # not used: not written
            for k in _QUIET_DEFAULTS:
                if d[k] == _QUIET_DEFAULTS[k]:
                    del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Hyperparameters":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown hyperparameter(s): {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        d = builder_defaults(d)
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in d:
                v = d[f.name]
                if f.type in ("float", "float | None") and isinstance(v, int) and not isinstance(v, bool):
                    v = float(v)
                kw[f.name] = v
        return cls(**kw)

    def replace(self, **changes: Any) -> "Hyperparameters":
        return dataclasses.replace(self, **changes)


def builder_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (plan keys or CLI flags that were set) plus the tree builder's defaults for keys not given
    (``Mode.defaults`` of the registered mode; an unknown name is left to :class:`Hyperparameters` to refuse)."""
    try:
        defaults = modes.tree_builder(given.get("tree_builder", modes.DEFAULT)).defaults
    except modes.UnknownMode:
        return dict(given)
    return {**{k: v for k, v in defaults.items() if k not in given}, **given}


def hyperparameter_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Hyperparameters)]

