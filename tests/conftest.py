from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DATASETS = SHARED / "datasets"
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def abalone():
    from common.data import load
    from common.schema import Schema

    return load(DATASETS / "abalone.data", Schema.load(EXAMPLES / "abalone" / "schema.toml"))


@pytest.fixture(scope="session")
def adult():
    from common.data import load
    from common.schema import Schema

    return load(DATASETS / "adult.data", Schema.load(EXAMPLES / "adult" / "schema.toml"))


def insecure(seed=0, noise=True):
    from common.randomness import InsecureTestRandomness

    return InsecureTestRandomness(seed=seed, noise=noise, i_understand_this_is_insecure=True)
