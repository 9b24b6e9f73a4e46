"""Modes as plug-ins: a registry of :class:`~fedsbdt.common.modes.base.Mode` objects (docs/modes.md).

A mode is one module that subclasses :class:`~fedsbdt.common.modes.base.Mode` and calls :func:`register`;
its module name is listed in :data:`BUILTIN` (or imported by whoever adds it) so that it registers itself.
:func:`mode_for` picks a plan's mode: an evaluation-only plan's ``evaluation`` mode, otherwise the mode
named by the plan's ``tree_builder``.
"""
from __future__ import annotations

import importlib

REGISTRY: dict = {}
BUILTIN = ("random", "greedy", "dpboost", "sarus", "evaluation")


class UnknownMode(ValueError):
    """No registered mode serves the plan."""


def register(mode) -> None:
    """Make ``mode`` (a Mode instance) available under ``mode.name``; a name is registered once."""
    if mode.name in REGISTRY and type(REGISTRY[mode.name]) is not type(mode):
        raise ValueError(f"a mode named {mode.name!r} is already registered")
    REGISTRY[mode.name] = mode


def _load_builtin() -> None:
    for m in BUILTIN:
        importlib.import_module(f"{__name__}.{m}")


def registered() -> dict:
    """Every registered mode by name (the built-in ones imported first): what the conformance suite
    (tests/federation/test_conformance.py) runs on, so a newly registered mode gets it for free."""
    _load_builtin()
    return dict(REGISTRY)


def mode_for(plan):
    """The registered mode of ``plan``."""
    return _registered("evaluation" if plan.eval_model_sha256 is not None else plan.hyperparameters.tree_builder)



def training_mode(hp):
    """The registered mode that trains with hyperparameters ``hp`` (before a plan pins them: ``fedsbdt plan``)."""
    return _registered(hp.tree_builder)


def _registered(name: str):
    if name not in REGISTRY:  # built-ins are always registered, whichever mode registered first
        _load_builtin()
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownMode(f"no mode {name!r} is registered (registered: {', '.join(sorted(REGISTRY))})") from None
