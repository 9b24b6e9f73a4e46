"""A plan's privacy statement, checked: its calibration, the stated σ and ε, and what its releases cost.

Every party recomputes these from the plan alone (a plan may come from a hostile coordinator).  The mode of
the plan's tree builder (:func:`fedsbdt.common.modes.training_mode`) calibrates a federation of its trees
(``Mode.federated_calibration``); the releases the mode declares (``plan.releases``: the noise the parties
draw, the events the gates charge) must compose to the ε the plan states (:func:`check_release_accounting`).
Pure functions of the plan: no I/O, no randomness.
"""
from __future__ import annotations

import math

from fedsbdt.common.accountant import AccountingError, PrivacyCalibration
from fedsbdt.common.config import ConfigError

from .errors import PlanError
from fedsbdt.common.accountant import default_alpha_max, event_epsilon_rdp
from fedsbdt.common.engine import calibration_for
from fedsbdt.common.modes import UnknownMode, mode_for, training_mode

#: Relative tolerance when a party compares the plan's stated σ and ε with its own accountant.
PRIVACY_RTOL = 1e-6


def federated_calibration(hp) -> PrivacyCalibration:
    """The accountant's calibration of a federation with these hyperparameters: the tree builder's mode says
    how (the central calibration, or the mode's federated mechanism: DPBoost's and Sarus trees' Gaussian
    releases).  A tree builder no registered mode federates is a :class:`PlanError`."""
    try:
        mode = training_mode(hp)
    except UnknownMode as e:
        raise PlanError(f"tree_builder = {hp.tree_builder!r} is not available in a federation ({e})") from None
    try:
        cal = mode.federated_calibration(hp)
    except AccountingError:
        raise
    except ConfigError as e:
        raise PlanError(str(e)) from None
    if cal is None:  # the mode federates the central mechanism
        cal = calibration_for(hp)
    return cal


def calibration(plan) -> PrivacyCalibration:
    """The accountant's calibration for the plan's hyperparameters (cached by the accountant)."""
    try:
        return federated_calibration(plan.hyperparameters)
    except AccountingError as e:
        raise PlanError(f"the plan's privacy parameters are impossible: {e}") from None


def verify_privacy(plan) -> PrivacyCalibration:
    """Recompute σ and ε with this party's accountant; refuse a plan whose stated values differ, or whose
    releases cost another ε (:func:`check_release_accounting`)."""
    cal = calibration(plan)
    for what, stated, mine in (("σ", plan.stated_sigma, cal.sigma), ("ε", plan.stated_epsilon, cal.epsilon)):
        if not math.isclose(stated, mine, rel_tol=PRIVACY_RTOL, abs_tol=0.0):
            raise PlanError(f"the plan states {what} = {stated!r} but this party's accountant gives "
                            f"{mine!r} for the plan's hyperparameters; refusing a plan whose noise does not "
                            "match its privacy claim")
    check_release_accounting(plan)
    return cal


def check_release_accounting(plan) -> None:
    """Refuse a plan whose statement of ε is not what its releases cost.

    The training releases the schedule allows a record (the mode's ``plan_event``: the events of the declared
    releases, which the gates charge and which are computed from the noise the sites draw) must compose to the
    stated ε at the plan's δ (RDP ledger, Cor. 6), and the evaluation's event to ε_eval.  A mode whose
    calibration and release declarations disagree — federated DPBoost's levels drawn as Gaussians of σ_s but
    charged as ε = 0 exponential-mechanism events (issue 37, finding 1) — cannot produce or join a plan."""
    mode, hp = mode_for(plan), plan.hyperparameters
    checks = []
    if mode.trains(plan):
        checks.append(("ε", plan.stated_epsilon, mode.plan_event(plan, without=("eval",)), hp.delta))
    if plan.eval_spec is not None:
        checks.append(("ε_eval", float(plan.eval_spec.epsilon), plan.releases["eval"].event,
                       float(plan.eval_spec.delta)))
    for what, stated, event, delta in checks:
        got = event_epsilon_rdp(event, delta, default_alpha_max(stated, delta))[0]
        if not math.isclose(got, stated, rel_tol=PRIVACY_RTOL, abs_tol=0.0):
            raise PlanError(f"the plan states {what} = {stated!r}, but the releases its sites draw noise for "
                            f"cost {got!r} (mode {mode.name}: {', '.join(plan.releases)}); refusing a plan "
                            "whose privacy statement is not what its releases are charged")
