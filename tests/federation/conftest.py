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
#: the sites of a three-hospital test federation
SITES = ["hospital-1", "hospital-2", "hospital-3"]


# --------------------------------------------------------------------------- data and plans


def abalone_with_ids(n: int | None = None):
    """Abalone rows with an explicit record-id column (so a federated run and a central run see the same ids)."""
    from fedsbdt.common.schema import Schema

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
        from fedsbdt.common.federation.keys import load_identity

        return load_identity(self.dir / "identity.key")

    @property
    def public(self) -> bytes:
        from fedsbdt.common.federation.keys import read_identity_pub

        return read_identity_pub(self.dir / "identity.pub")


def make_identities(root: Path, sites: list[str], ca_dir: Path | None = None) -> dict[str, Identity]:
    """Keys (and, with a CA, certificates) for each site, in ``root/<site>`` (the site's state directory)."""
    from fedsbdt.common.federation.keys import keygen
    from fedsbdt.common.federation.pki import ca_sign

    out = {}
    for s in sites:
        d = root / s
        keygen(s, d)
        if ca_dir is not None:
            ca_sign(ca_dir, d / "tls.csr", d / "tls.crt", days=2)
        out[s] = Identity(s, d)
    return out


def make_test_plan(schema, ids: dict[str, Identity], hp=None, **session):
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan

    hp = hp or Hyperparameters(trees=8, depth=2, seed=7, epsilon=1.0)
    session.setdefault("deadlines", Deadlines(join=30.0, stage=10.0, quorum=120.0, finish=20.0))
    session.setdefault("max_records_per_site", 10_000)
    return make_plan(schema, hp, [SiteEntry(s, i.public) for s, i in ids.items()], **session)


@dataclass
class SessionFiles:
    """What :func:`tls_session_files` wrote: the sites' identities, the plan, each site's training file (and
    held-out file)."""

    ids: dict[str, Identity]
    plan: object  # fedsbdt.common.federation.plan.Plan
    data: dict[str, Path]
    held: dict[str, Path] | None


def tls_session_files(root: Path, ca_dir: Path, schema, raw: pd.DataFrame, hp, sites: list[str] = SITES,
                      held_out: pd.DataFrame | None = None, hosts=("localhost", "127.0.0.1"),
                      **session) -> SessionFiles:
    """Everything a mutual-TLS session of ``sites`` needs below ``root``: each site's keys and certificate
    (``root/<site>``), the coordinator's certificate for ``hosts`` (``root/coordinator``), the rows ``raw``
    dealt round-robin into the sites' files (``root/data``; ``held_out`` into ``root/held-out``) and the plan
    (``root/plan.toml``, :func:`make_test_plan` with ``session``)."""
    from fedsbdt.common.federation.pki import ca_server

    ids = make_identities(root, sites, ca_dir)
    ca_server(ca_dir, root / "coordinator", list(hosts), days=2)
    data = write_splits(raw, sites, root / "data")
    held = write_splits(held_out, sites, root / "held-out") if held_out is not None else None
    plan = make_test_plan(schema, ids, hp, **session)
    plan.save(root / "plan.toml")
    return SessionFiles(ids, plan, data, held)


def site_model(root: Path, site: str, coordinator_model: bytes) -> Path:
    """Where ``site`` (state ``root/site``) wrote the model of the plan the coordinator's ``model.json`` names."""
    import json

    from fedsbdt.client.site import model_path

    return model_path(root / site, json.loads(coordinator_model)["training"]["plan_sha256"])


def models_identical(root: Path, sites) -> bytes:
    """The coordinator's ``model.json`` (bytes), after asserting that every site wrote the very same file (its
    ``model-<plan hash prefix>.json``)."""
    ref = (root / "coordinator" / "model.json").read_bytes()
    for s in sites:
        assert site_model(root, s, ref).read_bytes() == ref, f"{s}'s model differs from the coordinator's"
    return ref


def central_training(root: Path, schema, raw: pd.DataFrame, hp, seed: int):
    """The centralised engine on the union of the sites' rows (written to ``root/union.csv`` and parsed as the
    sites parse their files), with the insecure test randomness of ``seed`` and noise off: (dataset, result)."""
    from fedsbdt.common.data import load
    from fedsbdt.common.engine import train
    from fedsbdt.common.randomness import InsecureTestRandomness

    union = root / "union.csv"
    raw.to_csv(union, index=False)
    ds = load(union, schema)
    return ds, train(ds, hp, InsecureTestRandomness(seed=seed, noise=False, i_understand_this_is_insecure=True))


def assert_same_trees(model: dict, ref, default_left: bool = False) -> None:
    """A released ``model.json`` has exactly the trees of the :class:`~fedsbdt.common.model.Ensemble` ``ref`` (their
    features, thresholds and leaves, and with ``default_left`` the directions of missing values)."""
    for t, r in zip(model["trees"], ref.trees, strict=True):
        if default_left:
            assert t["default_left"] == r.default_left.tolist()
        assert (t["features"], t["thresholds"], t["leaves"]) == (r.features.tolist(), r.thresholds.tolist(),
                                                                 r.leaves.tolist())


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

    def run(self, data: dict[str, Path], *flags: str, held: dict[str, Path] | None = None,
            timeout: float = 120.0) -> Proc:
        """Start the coordinator and a site per file of ``data`` (with ``flags``, and ``--eval-data`` its file of
        ``held``), wait for all of them and assert that each exited 0; returns the coordinator's process."""
        coord = self.coordinator()
        sites = [self.site(s, path, *flags, *(("--eval-data", str(held[s])) if held else ()))
                 for s, path in data.items()]
        assert coord.wait(timeout=timeout) == 0, coord.errors
        for p in sites:
            assert p.wait() == 0, p.errors
        return coord

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
    from fedsbdt.common.federation.pki import ca_init

    d = tmp_path_factory.mktemp("ca")
    ca_init(d, days=2)
    return d
