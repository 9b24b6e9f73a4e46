"""Modes as plug-ins: the registry of :class:`~fedsbdt.common.modes.base.Mode` objects (docs/plugins.md).

The registry is the only source of mode names: the ``--tree-builder`` choices and help, the validation of
``Hyperparameters.tree_builder``, the plan, the receipt and the report all ask it.  A mode is one package
that subclasses :class:`~fedsbdt.common.modes.base.Mode` and calls :func:`register` when imported; it arrives

* **built in** — a package under ``common/modes/`` (:func:`builtin`; always registered, whichever mode
  registered first), or
* **from another distribution** — an entry point in the group :data:`ENTRY_POINT_GROUP` (``fedsbdt.modes``)
  naming the module that registers it (or a ``Mode`` subclass or instance, registered here), loaded once,
  lazily, on the first look-up (XGBoost's name → factory registry; dp-accounting's accountants).

:func:`tree_builder` returns the mode a ``tree_builder`` name selects and refuses an unknown name with one
line listing the registered ones; :func:`mode_for` picks a plan's mode: an evaluation-only plan's
``evaluation`` mode, otherwise the mode named by the plan's ``tree_builder``.
"""
from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

#: the tree builder a run takes when it names none: S-BDT's random trees (the ``auto`` settings are fitted for it)
DEFAULT = "random"
#: the mode of an evaluation-only plan (``fedsbdt plan --evaluate-model``)
EVALUATION = "evaluation"
#: the entry-point group of modes from other distributions (docs/plugins.md "Worked example")
ENTRY_POINT_GROUP = "fedsbdt.modes"

REGISTRY: dict = {}
_LOADED: set = set()  # what has been imported: "builtin", "entry points"


class UnknownMode(ValueError):
    """No registered mode has the name asked for (or serves the plan)."""


class ModeLoadError(RuntimeError):
    """An entry point of the group ``fedsbdt.modes`` could not be loaded (it names the entry point)."""


def register(mode) -> None:
    """Make ``mode`` (a Mode instance) available under ``mode.name``; a name is registered once."""
    if mode.name in REGISTRY and type(REGISTRY[mode.name]) is not type(mode):
        raise ValueError(f"a mode named {mode.name!r} is already registered ({type(REGISTRY[mode.name]).__module__})")
    REGISTRY[mode.name] = mode


def builtin() -> list[str]:
    """The packages of the built-in modes: every package under ``common/modes/`` (a new one is found as it is)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def _load_builtin() -> None:
    if "builtin" in _LOADED:
        return
    for m in builtin():
        importlib.import_module(f"{__name__}.{m}")
    _LOADED.add("builtin")


def _load_entry_points() -> None:
    """Import every entry point of :data:`ENTRY_POINT_GROUP` once; a module registers its mode when imported,
    a ``Mode`` subclass or instance is registered here."""
    if "entry points" in _LOADED:
        return
    _LOADED.add("entry points")  # once, even if one fails: its error names it, every later look-up works
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - any failure of a third party's import is reported as its own
            raise ModeLoadError(f"the mode entry point {ep.name} = {ep.value!r} (group {ENTRY_POINT_GROUP}) "
                                f"failed to load: {type(e).__name__}: {e}") from e
        if isinstance(obj, type):  # a Mode subclass
            obj = obj()
        if isinstance(getattr(obj, "name", None), str) and obj.name not in REGISTRY:  # a Mode instance
            register(obj)


def _load() -> None:
    _load_builtin()
    _load_entry_points()


def registered() -> dict:
    """Every registered mode by name (built-in and entry-point modes imported first): what the conformance suite
    (tests/federation/test_conformance.py) runs on, so a newly registered mode gets it for free."""
    _load()
    return dict(REGISTRY)


def tree_builders() -> dict:
    """The registered modes that build trees (``--tree-builder`` choices), by name."""
    return {name: m for name, m in sorted(registered().items()) if m.is_tree_builder}


def get(name: str):
    """The registered mode ``name`` (any mode, evaluation included)."""
    if name not in REGISTRY:  # built-ins are always registered, whichever mode registered first
        _load()
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownMode(f"no mode {name!r} is registered (registered: {', '.join(sorted(REGISTRY))})") from None


def tree_builder(name: str):
    """The mode the tree builder ``name`` selects; an unknown name (or a mode that builds no trees) is refused
    with one line listing the registered tree builders."""
    mode = REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None:
        _load()
        mode = REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None or not mode.is_tree_builder:
        raise UnknownMode(f"no tree builder {name!r} is registered (registered: {', '.join(tree_builders())})")
    return mode


def mode_for(plan):
    """The registered mode of ``plan``."""
    return get(EVALUATION if plan.eval_model_sha256 is not None else plan.hyperparameters.tree_builder)


def training_mode(hp):
    """The registered mode that trains with hyperparameters ``hp`` (before a plan pins them: ``fedsbdt plan``)."""
    return tree_builder(hp.tree_builder)
