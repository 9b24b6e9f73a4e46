from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: the bundled UCI files (tests read only files inside the repository)
ABALONE = EXAMPLES / "abalone" / "abalone.data"
ADULT = EXAMPLES / "adult" / "adult.data"
ADULT_TEST = EXAMPLES / "adult" / "adult.test"


@pytest.fixture(autouse=True)
def _fedsbdt_logger_put_back():
    """Each test leaves the ``fedsbdt`` logger as it found it.  The CLI run in process (``main([...])``) points it
    at the current stderr with propagation off; left so, the background threads of later tests (gRPC servers
    winding down) wrote stray lines to the worker's real stderr, between the progress dots."""
    import logging

    logger = logging.getLogger("fedsbdt")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture(scope="session")
def abalone():
    from fedsbdt.common.data import load
    from fedsbdt.common.schema import Schema

    return load(ABALONE, Schema.load(EXAMPLES / "abalone" / "schema.toml"))


@pytest.fixture(scope="session")
def adult():
    from fedsbdt.common.data import load
    from fedsbdt.common.schema import Schema

    return load(ADULT, Schema.load(EXAMPLES / "adult" / "schema.toml"))


def insecure(seed=0, noise=True):
    from fedsbdt.common.randomness import InsecureTestRandomness

    return InsecureTestRandomness(seed=seed, noise=noise, i_understand_this_is_insecure=True)


@pytest.fixture(scope="session")
def postgres():
    """A throw-away PostgreSQL server for the session (tests/postgres_server.py): a failure to start it fails
    the tests that need it, with the server's words (nothing is skipped)."""
    from postgres_server import start

    server = start()
    yield server
    server.stop()
