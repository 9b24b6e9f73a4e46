"""Fixtures for the federation tests: keys, small site datasets, plans, and real processes on loopback.

``Cluster`` starts ``fedsbdt coordinator`` / ``fedsbdt client`` as separate
processes with ``--log-format json``; a reader thread per process parses its
log lines into events and wakes waiters, so tests wait for *events* (a tree
released, a site joined) rather than sleeping.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from .processes import EventLog, Proc, free_port, pin_plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples"


# --------------------------------------------------------------------------- data and plans


def abalone_with_ids(n: int | None = None):
    """Abalone rows with an explicit record-id column (so a federated run and a central run see the same ids)."""
    from common.schema import Schema

    base = Schema.load(EXAMPLES / "abalone" / "schema.toml").to_dict()
    d = dict(base)
    d["columns"] = ["rid"] + list(base["columns"])
    d["id_column"] = "rid"
    d["format"] = {"header": True, "separator": ",", "out_of_range": "clip"}
    schema = Schema.from_dict(d)
    raw = pd.read_csv(EXAMPLES / "abalone" / "abalone.data", header=None, names=base["columns"])
    if n is not None:
        raw = raw.iloc[:n]
    raw.insert(0, "rid", np.arange(len(raw)) * 7 + 11)
    return schema, raw


def write_splits(raw: pd.DataFrame, sites: list[str], folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for k, s in enumerate(sites):
        p = folder / f"{s}.csv"
        raw.iloc[k::len(sites)].to_csv(p, index=False)
        out[s] = p
    return out


@dataclass
class Identity:
    site_id: str
    dir: Path

    @property
    def key(self):
        from client.keys import load_identity

        return load_identity(self.dir / "identity.key")

    @property
    def public(self) -> bytes:
        from client.keys import read_identity_pub

        return read_identity_pub(self.dir / "identity.pub")


def make_identities(root: Path, sites: list[str], ca_dir: Path | None = None) -> dict[str, Identity]:
    """Keys (and, with a CA, certificates) for each site, in ``root/<site>`` (the site's state directory)."""
    from client.keys import keygen
    from common.federation.pki import ca_sign

    out = {}
    for s in sites:
        d = root / s
        keygen(s, d)
        if ca_dir is not None:
            ca_sign(ca_dir, d / "tls.csr", d / "tls.crt", days=2)
        out[s] = Identity(s, d)
    return out


def make_test_plan(schema, ids: dict[str, Identity], hp=None, **session):
    from common.config import Hyperparameters
    from common.federation.plan import Deadlines, SiteEntry, make_plan

    hp = hp or Hyperparameters(trees=8, depth=2, seed=7, epsilon=1.0)
    session.setdefault("deadlines", Deadlines(join=30.0, stage=10.0, quorum=120.0, finish=20.0))
    session.setdefault("max_records_per_site", 10_000)
    return make_plan(schema, hp, [SiteEntry(s, i.public) for s, i in ids.items()], **session)


@dataclass
class Cluster(EventLog):
    root: Path
    plan_path: Path
    port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def coordinator(self, *extra: str, tls: bool = True) -> Proc:
        args = ["coordinator", "--plan", str(self.plan_path), "--listen", f"127.0.0.1:{self.port}",
                "--state", str(self.root / "coordinator"), "--json", "--allow-insecure-test-randomness", *extra]
        if not tls:
            args.append("--insecure")
        p = Proc(self, "coordinator", args)
        self.procs.append(p)
        return p

    def site(self, sid: str, data: Path, *extra: str, state: Path | None = None, tls: bool = True) -> Proc:
        args = ["client", "--coordinator", self.address, "--site", sid, "--data", str(data),
                "--state", str(state or self.root / sid), "--json", "--reconnect-timeout", "60",
                *pin_plan(self.plan_path, extra), *extra]
        if not tls:
            args.append("--insecure")
        p = Proc(self, sid, args)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.p.poll() is None:
                p.kill()
        self.write_events(self.root / "events.jsonl")


def tree_event(proc: str = "coordinator", sites=None, min_tree: int = -1):
    def pred(ev):
        return (ev.get("_proc") == proc and ev.get("event") == "tree" and ev.get("tree", -1) >= min_tree
                and (sites is None or sorted(ev.get("sites", [])) == sorted(sites)))
    return pred


@pytest.fixture
def cluster_factory(tmp_path):
    made: list[Cluster] = []

    def make(plan_path: Path) -> Cluster:
        c = Cluster(tmp_path, plan_path)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture(scope="session")
def ca_dir(tmp_path_factory):
    from common.federation.pki import ca_init

    d = tmp_path_factory.mktemp("ca")
    ca_init(d, days=2)
    return d
