"""The package map: the repository's folders install as one import package, ``fedsbdt``.

Every package below each folder is discovered, never listed by hand (a hand-written list once left
``fedsbdt.common.modes`` out of the wheel).  ``tests/test_wheel.py`` builds the wheel and checks that it
holds every module and data file of these folders.  Metadata and dependencies: ``pyproject.toml``.
"""
from setuptools import find_packages, setup

# import name -> folder in the repository
CODE = {"fedsbdt": "protos/fedsbdt", "fedsbdt.common": "common", "fedsbdt.server": "server",
        "fedsbdt.client": "client"}
EXAMPLES = {"fedsbdt.examples": "examples"}  # the demo's data and the documented schemas, as package data


def packages() -> list[str]:
    return [f"{name}.{sub}" if sub else name
            for name, folder in CODE.items() for sub in ["", *find_packages(folder)]] + list(EXAMPLES)


setup(
    packages=packages(),
    package_dir={**CODE, **EXAMPLES},
    package_data={"fedsbdt.proto.v1": ["*.proto", "*.pyi"], "fedsbdt.examples": ["**/*"]},
    exclude_package_data={"": ["__pycache__/*", "*.pyc"]},
)
