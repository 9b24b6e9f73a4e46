"""Federated hyperparameter tuning: one *tuning plan* that runs K trial plans in turn (docs/auto.md
"Private tuning", "In a federation").

Each trial is an ordinary plan (common/federation/plan.py) with its own settings, its own training ε_t and
a federated evaluation ``[evaluation]`` at ε_e on the sites' held-out files; the coordinator keeps the trial
whose released (noisy) evaluation metric is best — post-processing of DP releases, no extra cost.

**Why plain composition, not Papernot–Steinke.**  Central ``fedsbdt tune`` releases only the winner, and
its random number of trials is what Papernot & Steinke's Thm. 2 bounds.  In a federation the coordinator
sees every trial's trees and every trial's evaluation, so what it learns is the adaptive composition of all
K trials: for the training records ``ε(Σ_i ρ_train,i)`` and for the held-out records ``ε(K·ρ_eval)`` (Thm. 5
and Cor. 6 of the accountant).  A record lies in the training file or in the held-out file, never both, so
the guarantee of one record is the larger of the two (parallel composition): the tuning plan states both,
each ≤ the budget it was planned for, and every party recomputes them from the trial plans.  K is fixed and
public (the tuning plan pins every trial plan; every site runs each one), and the composition covers every
trial's release, so what the coordinator logs, shows on its status page and writes (``tuning.json``, the
winner's ``training.tuning`` listing the trials) stays inside the stated guarantee — unlike ``fedsbdt tune``,
whose K must stay hidden (docs/auto.md "What a tuning plan releases").

A tuning plan file (TOML) names its trial plans, each pinned by its SHA-256::

    format = "fedsbdt-tuning"
    version = 1
    [tuning]
    epsilon = 1.0          # the training records: all K trainings composed
    epsilon_eval = 0.1     # the held-out records: all K evaluations composed
    [[trials]]
    plan = "plan.trial-1.toml"
    sha256 = "…"

Its hash (what a site pins) is the SHA-256 of the canonical JSON of the stated totals and the trials'
hashes.  The planner (:func:`plan_trials`) picks the trials around the plan's settings (the centre, the
centre with the cyclical flag flipped — the rule's least certain choice, docs/auto.md — then the other
one-step neighbours of :func:`fedsbdt.common.tuning.candidates` in a public order drawn from the plan's seed)
and the largest ε_t and ε_e whose compositions fit the budgets.
"""
from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsbdt.common import modes
from fedsbdt.common.accountant import compose, default_alpha_max, event_epsilon_rdp

from .plan import PRIVACY_RTOL, Plan, PlanError

FORMAT = "fedsbdt-tuning"
VERSION = 1
#: what every trial plan must share (the roster, the data's schema, the trust and noise parameters)
SHARED = ("schema", "sites", "threshold", "assumed_colluders", "dropout_slack", "noise", "randomness", "sampler",
          "max_records_per_site", "secagg_graph", "secagg_neighbours", "secagg_fast_path")
#: the released evaluation metric that picks the winner per task, and whether larger is better
WINNER_METRIC = {"binary": ("auc", True), "multiclass": ("accuracy", True), "regression": ("rmse", False)}


# --------------------------------------------------------------------------- accounting (pure)


def trial_events(plan: Plan):
    """(training-records event, held-out-records event) of one trial plan, for a worst-case record."""
    from fedsbdt.common.modes import mode_for

    mode = mode_for(plan)
    return mode.plan_event(plan, without=("eval",)), mode.event(plan, "eval")


def composed_epsilons(trials: list[Plan] | tuple[Plan, ...], delta: float) -> tuple[float, float]:
    """(ε of the training records, ε of the held-out records) over all ``trials`` (adaptive composition)."""
    events = [trial_events(p) for p in trials]
    train = compose(*[t for t, _ in events])
    held = compose(*[e for _, e in events])
    amax = _alpha_max(trials, delta)
    return event_epsilon_rdp(train, delta, amax)[0], event_epsilon_rdp(held, delta, amax)[0]


def _alpha_max(trials, delta: float) -> int:
    """Orders up to where Cor. 6's log(1/δ)/(α−1) is well below the smallest per-trial ε (as calibration does)."""
    eps = min(min(p.hyperparameters.epsilon, p.eval_epsilon) for p in trials)
    return default_alpha_max(eps, delta)


# --------------------------------------------------------------------------- the tuning plan


@dataclass(frozen=True)
class FederatedTuning:
    """K trial plans run in turn under one pinned hash; their composed privacy stated and checked."""

    trials: tuple[Plan, ...]
    stated_epsilon: float  # the training records, all trainings composed
    stated_epsilon_eval: float  # the held-out records, all evaluations composed

    def __post_init__(self) -> None:
        if len(self.trials) < 2:
            raise PlanError("a tuning plan runs at least two trial plans")
        first = self.trials[0]
        if first.schema.task not in WINNER_METRIC:
            raise PlanError(f"no winner metric for task {first.schema.task!r}")
        ids = [p.session_id for p in self.trials]
        if len(set(ids)) != len(ids) or len({p.sha256 for p in self.trials}) != len(ids):
            raise PlanError("the trial plans of a tuning plan must be distinct sessions (session.id)")
        for i, p in enumerate(self.trials):
            if p.eval_epsilon is None or p.eval_model_sha256 is not None:
                raise PlanError(f"trial {i + 1} ({p.session_id}): every trial trains and is scored by a federated "
                                "evaluation ([evaluation] epsilon, no model_sha256)")
            for name in SHARED:
                if getattr(p, name) != getattr(first, name):
                    raise PlanError(f"trial {i + 1} ({p.session_id}): {name} differs from trial 1's; the trials of "
                                    "a tuning plan share the roster, schema, trust and noise parameters")
            if p.hyperparameters.delta != first.hyperparameters.delta:
                raise PlanError(f"trial {i + 1} ({p.session_id}): δ differs from trial 1's")
        for what, stated in (("epsilon", self.stated_epsilon), ("epsilon_eval", self.stated_epsilon_eval)):
            if isinstance(stated, bool) or not isinstance(stated, (int, float)) or not (math.isfinite(stated)
                                                                                       and stated > 0):
                raise PlanError(f"tuning.{what} must be a positive number")
        mine = composed_epsilons(self.trials, self.delta)
        for what, stated, m in (("ε", self.stated_epsilon, mine[0]), ("ε_eval", self.stated_epsilon_eval, mine[1])):
            if not math.isclose(stated, m, rel_tol=PRIVACY_RTOL, abs_tol=0.0):
                raise PlanError(f"the tuning plan states {what} = {stated!r} for all trials together, but this "
                                f"party's accountant composes the trial plans to {m!r}; refusing it")

    @property
    def delta(self) -> float:
        return self.trials[0].hyperparameters.delta

    @property
    def task(self) -> str:
        return self.trials[0].schema.task

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                "tuning": {"epsilon": float(self.stated_epsilon), "epsilon_eval": float(self.stated_epsilon_eval)},
                "trials": [p.sha256 for p in self.trials]}

    @property
    def sha256(self) -> str:
        data = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        return hashlib.sha256(data).hexdigest()

    def settings(self, i: int) -> dict[str, Any]:
        """Trial ``i``'s tuned settings (what the trials differ in) and its ε."""
        hp = self.trials[i].hyperparameters
        return {k: getattr(hp, k) for k in ("trees", "depth", "subsample", "learning_rate", "cyclical", "l2",
                                            "epsilon")}

    def save(self, path: str | Path) -> list[Path]:
        """Write the trial plans next to ``path`` (``<stem>.trial-<i>.toml``), then the tuning plan itself."""
        from fedsbdt.common.files import write_atomic

        from .toml_writer import dumps

        path = Path(path)
        names = [f"{path.stem}.trial-{i + 1}.toml" for i in range(len(self.trials))]
        written = []
        for p, name in zip(self.trials, names):
            p.save(path.parent / name)
            written.append(path.parent / name)
        doc = self.to_dict() | {"trials": [{"plan": n, "sha256": p.sha256} for n, p in zip(names, self.trials)]}
        write_atomic(path, dumps(doc, header=(
            "fedsbdt tuning plan: K trial plans run in turn, each scored by a federated evaluation.\n"
            f"tuning plan hash (give it to every site out of band with this file and the trial plans): {self.sha256}\n"
            "epsilon / epsilon_eval: the trials' training / evaluation releases composed (docs/auto.md).")),
            "tuning plan")
        return [path, *written]

    @classmethod
    def load(cls, path: str | Path) -> "FederatedTuning":
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PlanError(f"plan file not found: {path}") from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise PlanError(f"{path}: not a readable tuning plan ({e})") from None
        return cls.from_dict(raw, path)

    @classmethod
    def from_dict(cls, d: dict, path: Path) -> "FederatedTuning":
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise PlanError(f"{path}: not a fedsbdt tuning plan of version {VERSION}")
        t, trials = d.get("tuning"), d.get("trials")
        if set(d) != {"format", "version", "tuning", "trials"} or not isinstance(t, dict) \
                or set(t) != {"epsilon", "epsilon_eval"} or not isinstance(trials, list):
            raise PlanError(f"{path}: a tuning plan has exactly format, version, [tuning] (epsilon, epsilon_eval) "
                            "and [[trials]] (plan, sha256)")
        plans = []
        for i, e in enumerate(trials):
            if not isinstance(e, dict) or set(e) != {"plan", "sha256"} or not isinstance(e["plan"], str):
                raise PlanError(f"{path}: trials[{i}] must have exactly 'plan' (a file name) and 'sha256'")
            p = Plan.load(path.parent / e["plan"])
            if p.sha256 != e["sha256"]:
                raise PlanError(f"{path}: trial plan {e['plan']} has hash {p.sha256}, but the tuning plan pins "
                                f"{e['sha256']}; refusing it")
            p.verify_privacy()
            plans.append(p)
        try:
            return cls(tuple(plans), t["epsilon"], t["epsilon_eval"])
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None


def is_tuning_plan(path: str | Path) -> bool:
    """Whether the TOML file at ``path`` is a tuning plan (``format = "fedsbdt-tuning"``); False if unreadable
    (the plan loader then says why)."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


# --------------------------------------------------------------------------- planning


def trial_settings(centre: dict, k: int, seed: int) -> list[dict]:
    """``k`` settings around ``centre``: itself, the cyclical flag flipped, then other one-step neighbours
    (:func:`fedsbdt.common.tuning.candidates`) in an order drawn from the public ``seed``."""
    import numpy as np

    from fedsbdt.common.tuning import candidates

    space = candidates(centre)
    flip = {**centre, "cyclical": not centre["cyclical"]}
    rest = [c for c in space[1:] if c != flip]
    order = np.random.default_rng(seed).permutation(len(rest))
    out = [space[0], flip, *(rest[i] for i in order)]
    if not 2 <= k <= len(out):
        raise PlanError(f"--tune-trials must be between 2 and {len(out)} (the centre and its one-step neighbours)")
    return out[:k]


def plan_trials(make, hp, task: str, k: int, epsilon: float, epsilon_eval: float,
                matched_l2: bool) -> FederatedTuning:
    """The tuning plan of ``k`` trials around ``hp`` whose trainings compose to ≤ ``epsilon`` and evaluations to
    ≤ ``epsilon_eval``.  ``make(hp, session_suffix, eval_epsilon)`` builds one trial plan (``make_plan`` with the
    session's other parameters); ``matched_l2``: each trial's λ matched to its own leaf noise (as ``auto``)."""
    from fedsbdt.common.auto import noise_matched_l2
    from fedsbdt.common.tuning import largest_fitting

    if hp.tree_builder != modes.DEFAULT:
        raise PlanError(f"federated tuning searches the auto rule's {modes.DEFAULT} trees, not "
                        f"{hp.tree_builder} trees; leave out --tree-builder")
    keys = ("trees", "depth", "subsample", "learning_rate", "cyclical")
    centre = {key: getattr(hp, key) for key in keys}
    settings = trial_settings(centre, k, hp.seed)

    def trial_hp(s: dict, eps: float):
        h = hp.replace(**s, epsilon=eps)
        return h.replace(l2=noise_matched_l2(h, task)) if matched_l2 else h

    def trainings(eps: float) -> float:
        plans = [make(trial_hp(s, eps), f"-trial-{i + 1}", 1.0) for i, s in enumerate(settings)]
        return composed_epsilons(plans, hp.delta)[0]

    eps_t = largest_fitting(trainings, epsilon, f"ε = {epsilon:g} is too small for {k} trials: no per-trial budget "
                            "fits once all trials are composed")

    def evaluations(eps: float) -> float:
        plan = make(trial_hp(settings[0], eps_t), "-trial-1", eps)
        return composed_epsilons([plan] * k, hp.delta)[1]

    eps_e = largest_fitting(evaluations, epsilon_eval, f"ε_eval = {epsilon_eval:g} is too small for {k} trials' "
                            "evaluations once they are composed")
    plans = tuple(make(trial_hp(s, eps_t), f"-trial-{i + 1}", eps_e) for i, s in enumerate(settings))
    total = composed_epsilons(plans, hp.delta)
    return FederatedTuning(plans, total[0], total[1])


def pick_winner(task: str, metrics: list[dict | None]) -> int | None:
    """The index of the best released metric (:data:`WINNER_METRIC`), or None if no trial released one."""
    name, larger = WINNER_METRIC[task]
    scored = [(m[name], i) for i, m in enumerate(metrics) if m is not None and m.get(name) is not None]
    if not scored:
        return None
    return (max if larger else min)(scored)[1]
