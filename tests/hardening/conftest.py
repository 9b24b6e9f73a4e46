"""Fixtures for the hardening tests: federations of real processes, with cleanup guaranteed.

Reuses the federation tests' helpers (keys, certificates, Abalone with record
ids, plans); every fixture that starts processes, creates network namespaces
or mounts file systems undoes it in a ``finally``.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from federation.conftest import abalone_with_ids, ca_dir, tls_session_files  # noqa: F401

from .harness import Federation

SITES = ["hospital-1", "hospital-2", "hospital-3"]


@dataclass
class Setup:
    plan: object
    schema: object
    raw: object
    data: dict[str, Path]
    records: dict[str, int]
    plan_path: Path


def make_setup(root: Path, ca: Path, hp, n_rows: int = 450, sites=SITES, hosts=("localhost", "127.0.0.1"),
               **session) -> Setup:
    """Keys and certificates for every site, a coordinator certificate, Abalone split in turn, the plan."""
    schema, raw = abalone_with_ids(n_rows)
    files = tls_session_files(root, ca, schema, raw, hp, list(sites), hosts=hosts, **session)
    records = {s: len(raw.iloc[k::len(sites)]) for k, s in enumerate(sites)}
    return Setup(files.plan, schema, raw, files.data, records, root / "plan.toml")


@pytest.fixture
def federation(tmp_path):
    """A factory of :class:`Federation` objects; every process they started is killed at teardown."""
    made: list[Federation] = []

    def make(plan_path: Path, **kw) -> Federation:
        f = Federation(tmp_path, plan_path, **kw)
        made.append(f)
        return f

    try:
        yield make
    finally:
        for f in made:
            f.stop()


def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30, **kw)
