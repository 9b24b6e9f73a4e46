"""The lifetime ledger: every release made from one dataset, across plans, sessions, evaluations and central runs.

One SQLite database per state directory (``<state>/lifetime.sqlite``, 0600).  A *dataset* is keyed by the
data's identity — the SHA-256 of the file's content (or of a data source's description) together with the
SHA-256 of its record ids — so the same records reached through another plan, another session or a central
``fedsbdt train --ledger DIR`` land in the same account.  Each *release* row says when, for which plan (its
hash), what purpose (``init``, ``level``, ``tree``, ``sketch``, ``eval``, ``train``), which records it read
(a bit mask over the dataset's records in load order; NULL: all of them) and its privacy event
(common/accountant.py events as JSON, the cost to a worst-case record it read).

The lifetime guarantee of a dataset is the composition, record by record, of the releases that read it: a
record's RDP curve is the sum of the curves of its releases (adaptive composition), converted to (ε, δ)
by Cor. 6 at δ = the largest δ of the plans that charged it, maximised over records.  Releases stated only
as (ε, δ) (``{"type": "approx"}``; e.g. a central run) add by basic composition: ε and δ both add.

Pure functions (:func:`event_to_json`, :func:`event_from_json`, :func:`curves_epsilon`) and one class
(:class:`LifetimeLedger`) that reads and writes the database it is given.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .accountant import (ComposedEvent, ExponentialEvent, GaussianEvent, LaplaceEvent, ParallelEvent,
                         PoissonSampledEvent, alpha_grid, event_rdp, rdp_to_dp)

#: Default of ``--lifetime-epsilon`` (docs/privacy.md "Lifetime ledger"): the ε a site lets one dataset spend
#: over all plans, sessions, evaluations and central runs together.
DEFAULT_LIFETIME_EPSILON = 10.0
FILE = "lifetime.sqlite"
ALPHAS = alpha_grid()

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (key TEXT PRIMARY KEY, source TEXT NOT NULL, content_sha256 TEXT NOT NULL,
    ids_sha256 TEXT NOT NULL, records INTEGER NOT NULL, first_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL, at REAL NOT NULL,
    plan_sha256 TEXT, purpose TEXT NOT NULL, tree INTEGER, level INTEGER, round_id INTEGER,
    records INTEGER NOT NULL, mask BLOB, event TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL);
CREATE INDEX IF NOT EXISTS releases_by_plan ON releases (dataset, plan_sha256);
"""


class LifetimeError(RuntimeError):
    """The lifetime ledger cannot be used (or a release does not fit its dataset)."""


# --------------------------------------------------------------------------- events as JSON


def event_to_json(event) -> dict:
    """An accountant event as a JSON-able dict (``{"type": "approx", "epsilon", "delta"}`` passes through)."""
    if isinstance(event, dict):
        return dict(event)
    if isinstance(event, GaussianEvent):
        return {"type": "gaussian", "noise_multiplier": float(event.noise_multiplier)}
    if isinstance(event, PoissonSampledEvent):
        return {"type": "poisson", "rate": float(event.rate), "event": event_to_json(event.event)}
    if isinstance(event, ExponentialEvent):
        return {"type": "exponential", "epsilon": float(event.epsilon)}
    if isinstance(event, LaplaceEvent):
        return {"type": "laplace", "epsilon": float(event.epsilon)}
    if isinstance(event, ComposedEvent):
        return {"type": "composed", "count": int(event.count), "events": [event_to_json(e) for e in event.events]}
    if isinstance(event, ParallelEvent):
        return {"type": "parallel", "events": [event_to_json(e) for e in event.events]}
    raise LifetimeError(f"cannot record the privacy event {event!r}")


def event_from_json(d: dict):
    t = d["type"]
    if t == "gaussian":
        return GaussianEvent(float(d["noise_multiplier"]))
    if t == "poisson":
        return PoissonSampledEvent(float(d["rate"]), event_from_json(d["event"]))
    if t == "exponential":
        return ExponentialEvent(float(d["epsilon"]))
    if t == "laplace":
        return LaplaceEvent(float(d["epsilon"]))
    if t == "composed":
        return ComposedEvent(tuple(event_from_json(e) for e in d["events"]), int(d["count"]))
    if t == "parallel":
        return ParallelEvent(tuple(event_from_json(e) for e in d["events"]))
    if t == "approx":
        return dict(d)
    raise LifetimeError(f"unknown privacy event type {t!r}")


def curve(d: dict) -> np.ndarray:
    """RDP curve of a JSON event at :data:`ALPHAS` (zero for an ``approx`` event, which composes apart)."""
    if d["type"] == "approx":
        return np.zeros(ALPHAS.shape)
    return event_rdp(event_from_json(d), ALPHAS)


def approx(d: dict) -> tuple[float, float]:
    """(ε, δ) of the ``approx`` parts of a JSON event (basic composition)."""
    return (float(d["epsilon"]), float(d["delta"])) if d["type"] == "approx" else (0.0, 0.0)


def curves_epsilon(curves: np.ndarray, delta: float) -> float:
    """The largest ε (Cor. 6, minimised over α) of the rows of ``curves`` at ``delta``; 0 for no rows."""
    curves = np.atleast_2d(curves)
    if curves.size == 0 or not np.any(curves > 0):
        return 0.0
    eps = rdp_to_dp(ALPHAS[None, :], curves, delta)
    return float(np.max(np.min(eps, axis=1)))


def event_epsilon(d: dict, delta: float) -> float:
    """ε of one release alone at ``delta``."""
    return curves_epsilon(curve(d)[None, :], delta) + approx(d)[0]


def sha256_ids(ids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(ids, np.int64)).astype("<i8").tobytes()).hexdigest()


def data_identity(source) -> str:
    """The digest of :func:`~fedsbdt.common.sources.source_identity`: a data file's content digest, or a
    database's normalised URL (no credentials) and query (the record ids complete the identity,
    :func:`dataset_key`)."""
    from .sources import source_identity

    return hashlib.sha256(source_identity(source).encode()).hexdigest()


def dataset_key(content_sha256: str, ids_sha256: str) -> str:
    """A dataset's identity: its content digest and its record ids together."""
    return hashlib.sha256(f"content:{content_sha256}\nids:{ids_sha256}".encode()).hexdigest()


@dataclass(frozen=True)
class Lifetime:
    """A dataset's lifetime guarantee: (ε, δ) over every release that read it."""

    epsilon: float
    delta: float
    releases: int


# --------------------------------------------------------------------------- the database


class LifetimeLedger:
    """``<state>/lifetime.sqlite``: datasets and their releases (one connection, one thread)."""

    def __init__(self, state_dir: str | os.PathLike, create: bool = True) -> None:
        self.path = Path(state_dir) / FILE
        if not create and not self.path.exists():
            raise LifetimeError(f"{self.path}: no lifetime ledger here (nothing was released from this state "
                                "directory)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise LifetimeError(f"{self.path}: cannot open the lifetime ledger: {e}") from None
        self._cache: dict[str, tuple[int, np.ndarray, float, float, float]] = {}

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ------------------------------------------------------------------ datasets

    def dataset(self, source: str, content_sha256: str, ids: np.ndarray) -> str:
        """Register (or find) the dataset with this content and these record ids; returns its key."""
        ids_sha = sha256_ids(ids)
        key = dataset_key(content_sha256, ids_sha)
        with self._tx():
            self.db.execute("INSERT OR IGNORE INTO datasets (key, source, content_sha256, ids_sha256, records, "
                            "first_seen) VALUES (?, ?, ?, ?, ?, ?)",
                            (key, str(source), content_sha256, ids_sha, int(np.asarray(ids).size), time.time()))
        return key

    def records(self, dataset: str) -> int:
        row = self.db.execute("SELECT records FROM datasets WHERE key = ?", (dataset,)).fetchone()
        if row is None:
            raise LifetimeError(f"unknown dataset {dataset[:16]}…")
        return int(row[0])

    def datasets(self) -> list[dict]:
        rows = self.db.execute("SELECT key, source, content_sha256, ids_sha256, records, first_seen FROM datasets "
                               "ORDER BY first_seen").fetchall()
        return [dict(zip(("key", "source", "content_sha256", "ids_sha256", "records", "first_seen"), r)) for r in rows]

    # ------------------------------------------------------------------ releases

    def charge(self, dataset: str, purpose: str, event, delta: float, mask: np.ndarray | None = None,
               plan_sha256: str | None = None, tree: int | None = None, level: int | None = None,
               round_id: int | None = None) -> int:
        """Record one release (committed when this returns); ``mask``: the records it read (None: all)."""
        n = self.records(dataset)
        d = event_to_json(event)
        if mask is not None:
            mask = np.asarray(mask, bool)
            if mask.shape != (n,):
                raise LifetimeError(f"a release's record mask has {mask.size} entries, the dataset {n} records")
            records, blob = int(mask.sum()), np.packbits(mask).tobytes()
        else:
            records, blob = n, None
        eps = event_epsilon(d, delta)
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO releases (dataset, at, plan_sha256, purpose, tree, level, round_id, records, mask, event, "
                "epsilon, delta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (dataset, time.time(), plan_sha256, purpose, tree, level, round_id, records, blob,
                 json.dumps(d, sort_keys=True), eps, float(delta)))
        self._cache.pop(dataset, None)
        return int(cur.lastrowid)

    def releases(self, dataset: str | None = None) -> list[dict]:
        q = ("SELECT id, dataset, at, plan_sha256, purpose, tree, level, round_id, records, event, epsilon, delta "
             "FROM releases" + (" WHERE dataset = ?" if dataset else "") + " ORDER BY id")
        rows = self.db.execute(q, (dataset,) if dataset else ()).fetchall()
        keys = ("id", "dataset", "at", "plan_sha256", "purpose", "tree", "level", "round_id", "records", "event",
                "epsilon", "delta")
        out = []
        for r in rows:
            d = dict(zip(keys, r))
            d["event"] = json.loads(d["event"])
            d["when"] = _dt.datetime.fromtimestamp(d["at"], _dt.timezone.utc).isoformat(timespec="seconds")
            out.append(d)
        return out

    def _rows(self, dataset: str, where: str = "", args: tuple = ()):
        return self.db.execute("SELECT mask, event, delta FROM releases WHERE dataset = ?" + where,
                               (dataset, *args)).fetchall()

    def curves(self, dataset: str, exclude_plan: str | None = None) -> tuple[np.ndarray, float, float, float]:
        """(per-record RDP curves (n × |α|), largest δ of the RDP releases, Σ ε and Σ δ of ``approx`` releases)."""
        n = self.records(dataset)
        where, args = ("", ()) if exclude_plan is None else (" AND (plan_sha256 IS NULL OR plan_sha256 != ?)",
                                                              (exclude_plan,))
        events: dict[str, int] = {}
        masks: list[tuple[int, bytes | None]] = []
        delta, a_eps, a_delta = 0.0, 0.0, 0.0
        for blob, ev, dl in self._rows(dataset, where, args):
            d = json.loads(ev)
            if d["type"] == "approx":
                a_eps, a_delta = a_eps + float(d["epsilon"]), a_delta + float(d["delta"])
                continue
            delta = max(delta, float(dl))
            masks.append((events.setdefault(ev, len(events)), blob))
        counts = np.zeros((n, len(events)), np.int64)
        for e, blob in masks:
            if blob is None:
                counts[:, e] += 1
            else:
                counts[:, e] += np.unpackbits(np.frombuffer(blob, np.uint8), count=n)
        table = np.array([curve(json.loads(ev)) for ev in events]) if events else np.zeros((0, ALPHAS.size))
        return counts @ table if events else np.zeros((n, ALPHAS.size)), delta, a_eps, a_delta

    def lifetime(self, dataset: str, extra_event=None, extra_delta: float = 0.0,
                 exclude_plan: str | None = None) -> Lifetime:
        """The dataset's lifetime (ε, δ); with ``extra_event``: as it would be after that release on every record
        (``exclude_plan``: without that plan's releases so far, e.g. to admit a plan again after a restart)."""
        c, delta, a_eps, a_delta = self.curves(dataset, exclude_plan)
        if extra_event is not None:
            d = event_to_json(extra_event)
            c = c + curve(d)[None, :]
            e, dl = approx(d)
            a_eps, a_delta = a_eps + e, a_delta + dl
            if d["type"] != "approx":
                delta = max(delta, float(extra_delta))
        eps = curves_epsilon(c, delta) if delta > 0 else 0.0
        n = int(self.db.execute("SELECT COUNT(*) FROM releases WHERE dataset = ?", (dataset,)).fetchone()[0])
        return Lifetime(eps + a_eps, delta + a_delta, n)


def summary(ledger: LifetimeLedger) -> dict:
    """Every dataset with its releases and lifetime (ε, δ): what ``fedsbdt ledger --json`` prints."""
    out = []
    for ds in ledger.datasets():
        lt = ledger.lifetime(ds["key"])
        rel = [{"when": r["when"], "plan_sha256": r["plan_sha256"], "purpose": r["purpose"], "tree": r["tree"],
                "level": r["level"], "round_id": r["round_id"], "records": r["records"], "epsilon": r["epsilon"],
                "delta": r["delta"], "event": r["event"]} for r in ledger.releases(ds["key"])]
        out.append({**ds, "lifetime": {"epsilon": lt.epsilon, "delta": lt.delta}, "releases": rel})
    return {"ledger": str(ledger.path), "datasets": out}
