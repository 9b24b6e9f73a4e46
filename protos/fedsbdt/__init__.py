"""fedsbdt: federated, differentially private gradient-boosted decision trees (S-BDT).

One import package.  The repository keeps its folders and installs them under it
(``pyproject.toml``, ``[tool.setuptools.package-dir]``):

==================  ==============  ==========================================================
import name         folder          what
==================  ==============  ==========================================================
``fedsbdt``         protos/fedsbdt  this file: the version and the public API
``fedsbdt.proto``   protos/fedsbdt  generated gRPC stubs (``fedsbdt.proto.v1``; wire package
                    /proto          ``fedsbdt.v1``)
``fedsbdt.common``  common/         engine, accountant, mechanisms, secure aggregation, CLI
``fedsbdt.server``  server/         the coordinator
``fedsbdt.client``  client/         the site daemon
==================  ==============  ==========================================================

The estimators are imported on first use, so ``import fedsbdt`` stays light (the site daemon
never loads pandas or scikit-learn)::

    from fedsbdt import SBDTClassifier
    clf = SBDTClassifier(epsilon=1.0, schema="schema.toml").fit(X, y)
"""
from __future__ import annotations

__version__ = "0.2.0"

__all__ = ["SBDTClassifier", "SBDTMulticlassClassifier", "SBDTRegressor", "__version__"]

_PUBLIC = {
    "SBDTClassifier": "fedsbdt.common.estimators",
    "SBDTRegressor": "fedsbdt.common.estimators",
    "SBDTMulticlassClassifier": "fedsbdt.common.estimators_multiclass",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'fedsbdt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
