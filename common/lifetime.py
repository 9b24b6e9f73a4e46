"""The lifetime ledger: one account per site population, charged by every release made from a state directory.

One SQLite database per state directory (``<state>/lifetime.sqlite``, 0600).  Every release a site makes
from it — a federated plan's rounds and evaluation, a central ``fedsbdt train --ledger DIR`` or ``fedsbdt
tune --ledger DIR`` run — charges **one account: the site's population** (its patients), whatever the
file, format, row order, query, URL or schema the records came through.  An operator opens another
account only by declaring a disjoint population by name (``--population NAME``); the ledger shows it.

What one load of records read is a *record set* (table ``datasets``), kept with its provenance — the source
as shown (never a password) and its digest (a file's content, or a database's URL and query) — which is
shown, never used as identity:

* **keyed** (the schema names a stable ``id_column``): the set stores its record ids (load order); a release
  charges the records it read (a bit mask over the set; NULL: all of them).  A record's lifetime cost is the
  composition of every release, in any set of the account, that read its id: the same person read from a
  reordered file, through a query or from another server composes, and a record new in a later file starts
  at its own history.
* **unkeyed** (no id column: ids are row numbers): a position names a record only within its set (the same
  bytes read again give the same set; a query's rows have no stable order, so each load of a query is a set
  of its own).  Any person of the population may be any of its records, so the set's worst position is
  charged to every record of the account (worst case: every record read it).

The account's lifetime guarantee is its worst record's: the record's RDP curve (the sum of the curves of
the releases that read it, adaptive composition, Thm. 5) converted by Cor. 6 at the operator's **lifetime
δ** (``--lifetime-delta``, :data:`DEFAULT_LIFETIME_DELTA`), never at a δ taken from the releases, so no
release can lower it.  A release known only as (ε, δ) (``{"type": "approx"}``: a central run without an RDP
curve, e.g. tuning) composes by basic composition and spends its δ from the lifetime δ:
ε = ε_RDP(δ_L − Σδ_i) + Σε_i, at δ_L; once Σδ_i reaches δ_L no finite ε is left (such a run is refused).

The first schema (fedsbdt ≤ 6a345f0: datasets keyed by content and record-id digests, without populations)
is upgraded in place (``PRAGMA user_version`` 0 → 2, columns added, every row kept); its sets hold no ids, so
they count as unkeyed until the same bytes with the same ids are read again, when the set takes the ids.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
import secrets
import sqlite3
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsbdt.common import modes

from .accountant import (ComposedEvent, ExponentialEvent, GaussianEvent, LaplaceEvent, ParallelEvent,
                         PoissonSampledEvent, alpha_grid, compose, default_alpha_max, event_epsilon_rdp, event_rdp,
                         init_score_events, rdp_to_dp)

#: Default of ``--lifetime-epsilon`` (docs/privacy.md "Lifetime ledger"): the ε a site lets one population spend
#: over all plans, sessions, evaluations and central runs together.
DEFAULT_LIFETIME_EPSILON = 10.0
#: Default of ``--lifetime-delta``: the δ at which the lifetime ε is stated (19 central runs stated only as
#: (ε, δ) at the default δ = 5e-8 fit in it; RDP releases spend none of it).
DEFAULT_LIFETIME_DELTA = 1e-6
#: The account of a site's records when no population is declared.
DEFAULT_POPULATION = "default"
FILE = "lifetime.sqlite"
ALPHAS = alpha_grid()
SCHEMA_VERSION = 2
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_V1 = """
CREATE TABLE IF NOT EXISTS datasets (key TEXT PRIMARY KEY, source TEXT NOT NULL, content_sha256 TEXT NOT NULL,
    ids_sha256 TEXT NOT NULL, records INTEGER NOT NULL, first_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL, at REAL NOT NULL,
    plan_sha256 TEXT, purpose TEXT NOT NULL, tree INTEGER, level INTEGER, round_id INTEGER,
    records INTEGER NOT NULL, mask BLOB, event TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL);
CREATE INDEX IF NOT EXISTS releases_by_plan ON releases (dataset, plan_sha256);
"""
#: What schema 2 adds to schema 1's tables (ALTER TABLE … ADD COLUMN: in place, every row kept).  A new database
#: is made the same way, so the upgrade runs on every database.
_V2_COLUMNS = (("datasets", "population", f"TEXT NOT NULL DEFAULT '{DEFAULT_POPULATION}'"),
               ("datasets", "keyed", "INTEGER NOT NULL DEFAULT 0"),
               ("datasets", "stable", "INTEGER NOT NULL DEFAULT 1"),
               ("datasets", "ids", "BLOB"),
               ("datasets", "legacy", "INTEGER NOT NULL DEFAULT 0"),
               ("releases", "session", "TEXT"))
_V2 = """
CREATE TABLE IF NOT EXISTS populations (name TEXT PRIMARY KEY, declared INTEGER NOT NULL, first_seen REAL NOT NULL);
CREATE INDEX IF NOT EXISTS datasets_by_population ON datasets (population, content_sha256, ids_sha256);
"""
#: a release's session: its plan, or one central run (rows of another writer may lack the column's value)
_SESSION = "COALESCE(r.session, r.plan_sha256, 'central:' || r.id)"


class LifetimeError(RuntimeError):
    """The lifetime ledger cannot be used (or a release does not fit its record set)."""


def check_population(name: str) -> str:
    """``name`` if it names a population (``--population``), else a one-line :class:`LifetimeError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LifetimeError(f"--population {name!r}: a population's name is 1 to 64 letters, digits, '.', '_' or "
                            "'-', starting with a letter or digit")
    return name


def check_lifetime_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise LifetimeError(f"--lifetime-delta must be in (0, 1) (got {delta!r})")
    return float(delta)


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


def epsilon_at(rdp: np.ndarray, approx_epsilon: float, approx_delta: float, delta: float) -> float:
    """ε at ``delta`` of an RDP curve composed with (ε, δ)-only releases (Σε, Σδ): Cor. 6 at δ − Σδ, plus
    Σε (basic composition); ∞ once Σδ reaches δ."""
    if approx_delta >= delta:
        return math.inf
    rdp_eps = 0.0
    if np.any(rdp > 0):
        rdp_eps = max(float(np.min(rdp_to_dp(ALPHAS, rdp, delta - approx_delta))), 0.0)
    return rdp_eps + approx_epsilon


def curves_epsilon(curves: np.ndarray, delta: float) -> float:
    """The largest ε (Cor. 6, minimised over α) of the rows of ``curves`` at ``delta``; 0 for no rows."""
    curves = np.atleast_2d(curves)
    return max((epsilon_at(c, 0.0, 0.0, delta) for c in curves), default=0.0)


def event_epsilon(d: dict, delta: float) -> float:
    """ε of one release alone at ``delta`` (an ``approx`` release: its own ε, whatever ``delta``)."""
    return curves_epsilon(curve(d)[None, :], delta) + approx(d)[0]


def sha256_ids(ids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(ids, np.int64)).astype("<i8").tobytes()).hexdigest()


def data_identity(source) -> str:
    """The digest of :func:`~fedsbdt.common.sources.source_identity`: a data file's content digest, or a
    database's normalised URL (no credentials) and query.  Provenance only: the ledger shows it, it names no
    account."""
    from .sources import source_identity

    return hashlib.sha256(source_identity(source).encode()).hexdigest()


# --------------------------------------------------------------------------- what a load read


@dataclass(frozen=True)
class RecordSource:
    """What one load of records read, as the ledger keeps it.

    Attributes:
        source: how the ledger shows it (a path, or a URL without credentials and ``(query)``).
        digest: its provenance digest (:func:`data_identity`).
        ids: the record ids in load order (int64, unique).
        keyed: the ids are the records' own (the schema's ``id_column``), not row numbers.
        stable: the same provenance gives the same records in the same order (a file's bytes, not a query).
    """

    source: str
    digest: str
    ids: np.ndarray = field(repr=False)
    keyed: bool
    stable: bool = True

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise LifetimeError("a record set's ids must be a 1-D integer array")
        if not (isinstance(self.digest, str) and re.fullmatch(r"[0-9a-f]{64}", self.digest)):
            raise LifetimeError(f"a record set's provenance digest must be 64 hex digits (got {self.digest!r})")
        object.__setattr__(self, "ids", np.ascontiguousarray(ids, np.int64))

    @property
    def ids_sha256(self) -> str:
        return sha256_ids(self.ids)


def record_source(source, ids, id_column: str | None) -> RecordSource:
    """The :class:`RecordSource` of records loaded from ``source`` (a file's path or a
    :class:`~fedsbdt.common.sources.DataSource`) under a schema whose ``id_column`` is ``id_column``."""
    from .sources import DataSource

    return RecordSource(str(source), data_identity(source), np.asarray(ids, np.int64), id_column is not None,
                        not isinstance(source, DataSource))


def central_event(hp, cal, eps_rows: float = 0.0):
    """What a central training run costs a worst-case record, for the ledger: the RDP events of its receipt
    where it is random trees accounted by RDP (Thm. 23: ``cal.rounds`` Poisson-subsampled Gaussian trees, the
    initial score's two discrete-Laplace releases, the DP quantile candidates, the DP row count of auto settings),
    checked to give the
    receipt's ε; otherwise its (ε, δ) alone (``approx``)."""
    whole = {"type": "approx", "epsilon": float(cal.epsilon + eps_rows), "delta": float(cal.delta)}
    if not modes.training_mode(hp).uniform_tree_rounds or cal.accountant != "rdp" or cal.sigma <= 0:
        return whole
    trees = compose(PoissonSampledEvent(cal.gamma, GaussianEvent(cal.sigma / math.sqrt(2.0))), count=cal.rounds)
    core = compose(trees, init_score_events(cal.eps_init, cal.eps_ds),
                   LaplaceEvent(cal.eps_candidates) if getattr(cal, "eps_candidates", 0.0) > 0 else None)
    eps, _ = event_epsilon_rdp(core, cal.delta, default_alpha_max(hp.epsilon, hp.delta))
    if not abs(eps - cal.epsilon) <= 1e-6 * max(1.0, cal.epsilon):  # not the receipt's accounting: (ε, δ) only
        return whole
    return compose(core, LaplaceEvent(eps_rows)) if eps_rows > 0 else core


# --------------------------------------------------------------------------- composition (the odometer)


@dataclass
class _Set:
    """A record set in memory: its ids (keyed) or its size, and the releases that read it (mask, event index)."""

    keyed: bool
    n: int
    ids: np.ndarray | None
    reads: list = field(default_factory=list)


@dataclass(frozen=True)
class Lifetime:
    """An account's lifetime guarantee: (ε, δ) of its worst record over every release that read it.

    ``records``: the records known by id (keyed sets); ``worst``: how many of them share the worst history
    (0 when the worst case is an unkeyed set's); ``approx_delta``: the δ the (ε, δ)-only releases of the worst
    record spend from the lifetime δ."""

    epsilon: float
    delta: float
    releases: int
    records: int = 0
    worst: int = 0
    approx_delta: float = 0.0


class _Histories:
    """Records with identical histories share one: a history is the multiset of the events that read a record
    (event index → count); each record holds the index of its history, so memory stays one integer per record."""

    def __init__(self) -> None:
        self.items: list[tuple] = [()]  # sorted ((event, count), …); 0: no release
        self._index: dict[tuple, int] = {(): 0}
        self._step: dict[tuple[int, int], int] = {}

    def _intern(self, counts: dict) -> int:
        """The index of the history with these event counts (added if new)."""
        t = tuple(sorted(counts.items()))
        if t not in self._index:
            self._index[t] = len(self.items)
            self.items.append(t)
        return self._index[t]

    def add(self, h: int, e: int) -> int:
        key = (h, e)
        if key not in self._step:
            d = dict(self.items[h])
            d[e] = d.get(e, 0) + 1
            self._step[key] = self._intern(d)
        return self._step[key]

    def merge(self, a: int, b: int) -> int:
        """The history of a record read by the releases of histories ``a`` and ``b`` (memoised)."""
        key = (a, -1 - b)
        if key not in self._step:
            d = dict(self.items[a])
            for e, k in self.items[b]:
                d[e] = d.get(e, 0) + k
            self._step[key] = self._intern(d)
        return self._step[key]

    def charge(self, hist: np.ndarray, where: np.ndarray, e: int) -> None:
        """The records ``where`` (indices into ``hist``) were read by event ``e`` (one gather: the histories
        present move to their successors, found without sorting)."""
        if where.size == 0:
            return
        sub = hist[where]
        step = np.arange(len(self.items), dtype=np.int64)
        for h in np.flatnonzero(np.bincount(sub, minlength=step.size)):
            step[h] = self.add(int(h), e)
        hist[where] = step[sub]


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values of ``a``, the index of each entry of ``a`` among them), by one argsort."""
    order = np.argsort(a)
    sorted_ = a[order]
    first = np.ones(a.size, bool)
    first[1:] = sorted_[1:] != sorted_[:-1]
    inverse = np.empty(a.size, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return sorted_[first], inverse


def _compose(sets: list[_Set], table: list[dict], delta: float, releases: int) -> Lifetime:
    """The worst record's (ε, δ) over ``sets`` whose reads index the JSON events ``table``."""
    curves = np.array([curve(d) for d in table]) if table else np.zeros((0, ALPHAS.size))
    apx = np.array([approx(d) for d in table]) if table else np.zeros((0, 2))

    def parts(h: tuple) -> tuple[np.ndarray, float, float]:
        c, e, dl = np.zeros(ALPHAS.size), 0.0, 0.0
        for ev, k in h:
            c, e, dl = c + k * curves[ev], e + k * apx[ev, 0], dl + k * apx[ev, 1]
        return c, e, dl

    hs = _Histories()
    floor_c, floor_e, floor_d = np.zeros(ALPHAS.size), 0.0, 0.0
    keyed = [s for s in sets if s.keyed]
    for s in sets:  # unkeyed: the set's worst position, for every record of the account
        if s.keyed:
            continue
        hist = np.zeros(s.n, np.int64)
        for mask, e in s.reads:
            hs.charge(hist, np.arange(s.n) if mask is None else np.flatnonzero(mask), e)
        found = [parts(hs.items[h]) for h in np.flatnonzero(np.bincount(hist))]
        floor_c = floor_c + np.max([f[0] for f in found], axis=0)
        floor_e += max(f[1] for f in found)
        floor_d += max(f[2] for f in found)
    if not keyed:
        return Lifetime(float(epsilon_at(floor_c, floor_e, floor_d, delta)), delta, releases, 0, 0, float(floor_d))
    # by record id, across every keyed set of the account: each set's rows compose in load order (sequential
    # memory), then the set's histories merge into its records' (one gather per set)
    all_ids, inverse = _unique_inverse(np.concatenate([s.ids for s in keyed]))
    hist = np.zeros(all_ids.size, np.int64)
    start = 0
    for s in keyed:
        at = inverse[start:start + s.n]
        start += s.n
        if not s.reads:
            continue
        local = np.zeros(s.n, np.int64)
        for mask, e in s.reads:
            hs.charge(local, np.arange(s.n) if mask is None else np.flatnonzero(mask), e)
        width = len(hs.items)
        pair = hist[at] * width + local
        pairs, which = _unique_inverse(pair)
        merged = np.array([hs.merge(int(p // width), int(p % width)) for p in pairs], np.int64)
        hist[at] = merged[which]
    counts = np.bincount(hist)
    best = (-1.0, 0, 0.0)
    for h in np.flatnonzero(counts):
        k = counts[h]
        c, e, dl = parts(hs.items[h])
        eps = epsilon_at(floor_c + c, floor_e + e, floor_d + dl, delta)
        if eps > best[0]:
            best = (eps, int(k), floor_d + dl)
    return Lifetime(float(best[0]), delta, releases, int(all_ids.size), best[1], float(best[2]))


def _add_extra(sets: dict[str, _Set], table: dict[str, int], extra, find) -> int:
    """Add the releases ``extra`` ((RecordSource, event) pairs, each reading all of its source) to ``sets`` (the
    set ``find(source)`` names, or a new one) and their events to ``table``; returns how many."""
    for i, (src, event) in enumerate(extra):
        ev = json.dumps(event_to_json(event), sort_keys=True)
        key = find(src)
        if key is None:
            key = f"extra:{i}"
            sets[key] = _Set(src.keyed, int(src.ids.size), src.ids if src.keyed else None)
        sets[key].reads.append((None, table.setdefault(ev, len(table))))
    return len(extra)


def projected_lifetime(delta: float, extra) -> Lifetime:
    """The lifetime an empty account would have after the releases ``extra`` (see :meth:`LifetimeLedger.lifetime`)."""
    sets: dict[str, _Set] = {}
    table: dict[str, int] = {}
    count = _add_extra(sets, table, extra, lambda src: None)
    return _compose(list(sets.values()), [json.loads(e) for e in table], float(delta), count)


# --------------------------------------------------------------------------- the database


def _pack_ids(ids: np.ndarray) -> bytes:
    return zlib.compress(np.ascontiguousarray(ids, np.int64).astype("<i8").tobytes(), 1)


def _unpack_ids(blob: bytes) -> np.ndarray:
    return np.frombuffer(zlib.decompress(blob), "<i8").astype(np.int64)


class LifetimeLedger:
    """``<state>/lifetime.sqlite``: populations, record sets and releases (one connection, one thread)."""

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
            self._upgrade()
        except (OSError, sqlite3.Error) as e:
            raise LifetimeError(f"{self.path}: cannot open the lifetime ledger: {e}") from None

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

    def _upgrade(self) -> None:
        """Schema 1 (or nothing) → schema 2, in one transaction; a later schema is refused, never rewritten."""
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            self.db.close()
            raise LifetimeError(f"{self.path}: written by a newer fedsbdt (lifetime ledger schema {version}; this "
                                f"version reads {SCHEMA_VERSION}): upgrade fedsbdt to use this state directory")
        with self._tx():
            if int(self.db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
                return  # another process upgraded it meanwhile
            for stmt in _V1.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            for table, column, decl in _V2_COLUMNS:
                have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            for stmt in _V2.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            # rows of schema 1: record sets without their ids (unkeyed), sessions named by plan or central run
            self.db.execute("UPDATE datasets SET legacy = 1 WHERE ids IS NULL AND keyed = 0 AND legacy = 0 "
                            "AND population = ?", (DEFAULT_POPULATION,))
            self.db.execute("UPDATE releases SET session = COALESCE(plan_sha256, 'central:' || id) "
                            "WHERE session IS NULL")
            self.db.execute("INSERT OR IGNORE INTO populations (name, declared, first_seen) SELECT ?, 0, "
                            "(SELECT MIN(first_seen) FROM datasets) WHERE EXISTS (SELECT 1 FROM datasets)",
                            (DEFAULT_POPULATION,))
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ------------------------------------------------------------------ record sets

    def _find(self, population: str, src: RecordSource) -> tuple[str | None, str | None]:
        """(the key of the set ``src`` is, or None; the key of a schema-1 set that ``src`` gives its ids, or None)."""
        if not src.stable and not src.keyed:
            return None, None  # a query's rows without ids: a set of its own each time
        row = self.db.execute("SELECT key FROM datasets WHERE population = ? AND content_sha256 = ? AND "
                              "ids_sha256 = ? AND keyed = ? AND (keyed = 1 OR stable = 1) ORDER BY first_seen",
                              (population, src.digest, src.ids_sha256, int(src.keyed))).fetchone()
        if row is not None:
            return row[0], None
        if src.keyed:  # the same bytes (or query) with the same ids in the same order: the old positions are these ids
            row = self.db.execute("SELECT key FROM datasets WHERE population = ? AND content_sha256 = ? AND "
                                  "ids_sha256 = ? AND keyed = 0 AND ids IS NULL AND legacy = 1 ORDER BY first_seen",
                                  (population, src.digest, src.ids_sha256)).fetchone()
            if row is not None:
                return None, row[0]
        return None, None

    def record_set(self, population: str, src: RecordSource) -> str:
        """Register (or find) the record set ``src`` in ``population``'s account; returns its key (committed)."""
        check_population(population)
        with self._tx():
            key, adopt = self._find(population, src)
            if adopt is not None:
                self.db.execute("UPDATE datasets SET keyed = 1, ids = ? WHERE key = ?", (_pack_ids(src.ids), adopt))
                key = adopt
            if key is None:
                salt = "" if src.keyed or src.stable else secrets.token_hex(16)
                key = hashlib.sha256(f"population:{population}\ncontent:{src.digest}\nids:{src.ids_sha256}\n"
                                     f"keyed:{int(src.keyed)}\n{salt}".encode()).hexdigest()
                self.db.execute("INSERT INTO datasets (key, source, content_sha256, ids_sha256, records, first_seen, "
                                "population, keyed, stable, ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                (key, src.source, src.digest, src.ids_sha256, int(src.ids.size), time.time(),
                                 population, int(src.keyed), int(src.stable),
                                 _pack_ids(src.ids) if src.keyed else None))
            self.db.execute("INSERT OR IGNORE INTO populations (name, declared, first_seen) VALUES (?, ?, ?)",
                            (population, int(population != DEFAULT_POPULATION), time.time()))
        return key

    def records(self, dataset: str) -> int:
        row = self.db.execute("SELECT records FROM datasets WHERE key = ?", (dataset,)).fetchone()
        if row is None:
            raise LifetimeError(f"unknown record set {dataset[:16]}…")
        return int(row[0])

    def populations(self) -> list[dict]:
        rows = self.db.execute("SELECT name, declared, first_seen FROM populations ORDER BY first_seen, name")
        return [{"population": n, "declared": bool(d), "first_seen": t} for n, d, t in rows]

    def datasets(self, population: str | None = None) -> list[dict]:
        """The record sets (with ``population``: of that account), oldest first, with their provenance."""
        q = ("SELECT key, source, content_sha256, ids_sha256, records, first_seen, population, keyed, stable, legacy "
             "FROM datasets" + (" WHERE population = ?" if population else "") + " ORDER BY first_seen, key")
        keys = ("key", "source", "content_sha256", "ids_sha256", "records", "first_seen", "population", "keyed",
                "stable", "legacy")
        out = []
        for r in self.db.execute(q, (population,) if population else ()):
            d = dict(zip(keys, r))
            d.update(keyed=bool(d["keyed"]), stable=bool(d["stable"]), legacy=bool(d["legacy"]))
            out.append(d)
        return out

    # ------------------------------------------------------------------ releases

    def charge(self, dataset: str, purpose: str, event, delta: float, mask: np.ndarray | None = None,
               plan_sha256: str | None = None, tree: int | None = None, level: int | None = None,
               round_id: int | None = None, session: str | None = None) -> int:
        """Record one release (committed when this returns); ``mask``: the records of the set it read (None: all);
        ``session``: the plan's hash by default, else name it (a central run: ``central:…``)."""
        n = self.records(dataset)
        d = event_to_json(event)
        if mask is not None:
            mask = np.asarray(mask, bool)
            if mask.shape != (n,):
                raise LifetimeError(f"a release's record mask has {mask.size} entries, the record set {n} records")
            records, blob = int(mask.sum()), np.packbits(mask).tobytes()
        else:
            records, blob = n, None
        eps = event_epsilon(d, delta)
        session = session or plan_sha256 or f"central:{secrets.token_hex(8)}"
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO releases (dataset, at, plan_sha256, purpose, tree, level, round_id, records, mask, event, "
                "epsilon, delta, session) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (dataset, time.time(), plan_sha256, purpose, tree, level, round_id, records, blob,
                 json.dumps(d, sort_keys=True), eps, float(delta), session))
        return int(cur.lastrowid)

    def releases(self, population: str | None = None, session: str | None = None) -> list[dict]:
        where, args = [], []
        if population is not None:
            where.append("d.population = ?")
            args.append(population)
        if session is not None:
            where.append(f"{_SESSION} = ?")
            args.append(session)
        q = ("SELECT r.id, r.dataset, r.at, r.plan_sha256, r.purpose, r.tree, r.level, r.round_id, r.records, "
             f"r.event, r.epsilon, r.delta, {_SESSION}, d.population FROM releases r JOIN datasets d "
             "ON r.dataset = d.key"
             + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id")
        keys = ("id", "dataset", "at", "plan_sha256", "purpose", "tree", "level", "round_id", "records", "event",
                "epsilon", "delta", "session", "population")
        out = []
        for r in self.db.execute(q, args):
            d = dict(zip(keys, r))
            d["event"] = json.loads(d["event"])
            d["when"] = _dt.datetime.fromtimestamp(d["at"], _dt.timezone.utc).isoformat(timespec="seconds")
            out.append(d)
        return out

    def _sets(self, population: str, exclude_plan: str | None = None, session: str | None = None,
              extra=()) -> tuple[list[_Set], list[dict], int]:
        """The account's record sets in memory with their reads, the event table, the number of releases; ``extra``:
        (RecordSource, event) releases that read every record of their source, as if made now."""
        sets: dict[str, _Set] = {}
        only = ("" if session is None else  # a session alone: the sets it read
                f" AND key IN (SELECT r.dataset FROM releases r WHERE {_SESSION} = ?)")
        for key, keyed, n, blob in self.db.execute("SELECT key, keyed, records, ids FROM datasets WHERE population = ?"
                                                   + only, (population,) + (() if session is None else (session,))):
            sets[key] = _Set(bool(keyed), int(n), _unpack_ids(blob) if keyed else None)
        where, args = "d.population = ?", [population]
        if exclude_plan is not None:
            where += " AND (r.plan_sha256 IS NULL OR r.plan_sha256 != ?)"
            args.append(exclude_plan)
        if session is not None:
            where += f" AND {_SESSION} = ?"
            args.append(session)
        table: dict[str, int] = {}
        count = 0
        for key, blob, ev in self.db.execute("SELECT r.dataset, r.mask, r.event FROM releases r JOIN datasets d ON "
                                             f"r.dataset = d.key WHERE {where} ORDER BY r.id", args):
            s = sets[key]
            mask = None if blob is None else np.unpackbits(np.frombuffer(blob, np.uint8), count=s.n).astype(bool)
            s.reads.append((mask, table.setdefault(ev, len(table))))
            count += 1
        count += _add_extra(sets, table, extra, lambda src: self._find(population, src)[0])
        return list(sets.values()), [json.loads(e) for e in table], count

    def lifetime(self, population: str = DEFAULT_POPULATION, delta: float = DEFAULT_LIFETIME_DELTA, extra=(),
                 exclude_plan: str | None = None, session: str | None = None) -> Lifetime:
        """The account's lifetime (ε, δ) at the lifetime δ ``delta``; with ``extra`` ((RecordSource, event)
        pairs): as it would be after those releases, each reading every record of its source
        (``exclude_plan``: without that plan's releases so far, to admit it again after a restart);
        ``session``: that session's releases alone."""
        sets, table, count = self._sets(population, exclude_plan, session, extra)
        return _compose(sets, table, float(delta), count)

    def plan_counts(self, dataset: str, plan_sha256: str, kinds: list[str]) -> np.ndarray:
        """How many releases of each kind of ``kinds`` the plan charged each record of the set ``dataset`` (records ×
        kinds): by record id across the account's keyed sets, by position in an unkeyed set."""
        row = self.db.execute("SELECT population, keyed, records, ids FROM datasets WHERE key = ?",
                              (dataset,)).fetchone()
        if row is None:
            raise LifetimeError(f"unknown record set {dataset[:16]}…")
        population, keyed, n, blob = row
        counts = np.zeros((int(n), len(kinds)), np.int64)
        if keyed:
            mine = _unpack_ids(blob)
            if mine.size == 0:
                return counts
            order = np.argsort(mine)
            rows = self.db.execute("SELECT r.mask, r.purpose, d.records, d.ids FROM releases r JOIN datasets d ON "
                                   "r.dataset = d.key WHERE d.population = ? AND d.keyed = 1 AND r.plan_sha256 = ?",
                                   (population, plan_sha256))
        else:
            rows = self.db.execute("SELECT r.mask, r.purpose, d.records, NULL FROM releases r JOIN datasets d ON "
                                   "r.dataset = d.key WHERE d.key = ? AND r.plan_sha256 = ?", (dataset, plan_sha256))
        for blob_mask, kind, m, ids_blob in rows:
            if kind not in kinds:
                continue
            j = kinds.index(kind)
            read = (np.ones(int(m), bool) if blob_mask is None else
                    np.unpackbits(np.frombuffer(blob_mask, np.uint8), count=int(m)).astype(bool))
            if not keyed:
                counts[:, j] += read
                continue
            theirs = _unpack_ids(ids_blob)[read]
            pos = np.searchsorted(mine, theirs, sorter=order)
            pos = np.minimum(pos, mine.size - 1)
            hit = mine[order[pos]] == theirs
            counts[order[pos[hit]], j] += 1
        return counts

    def sessions(self, population: str, delta: float) -> list[dict]:
        """One row per session (a plan, or a central run) of the account, oldest first: when, what, how many
        releases of which purpose, the records read, the record sets' provenance and the session's own ε at the
        lifetime δ (its worst record)."""
        rows = self.db.execute(
            f"SELECT {_SESSION} AS s, MIN(r.at), MAX(r.at), r.plan_sha256, COUNT(*), MIN(r.id) FROM releases r "
            "JOIN datasets d ON r.dataset = d.key WHERE d.population = ? GROUP BY s ORDER BY MIN(r.id)",
            (population,)).fetchall()
        out = []
        for s, first, last, plan, n, _ in rows:
            purposes: dict[str, int] = {}
            srcs: dict[str, dict] = {}
            for p, key, src, digest, records, keyed, legacy in self.db.execute(
                    "SELECT r.purpose, d.key, d.source, d.content_sha256, d.records, d.keyed, d.legacy FROM "
                    f"releases r JOIN datasets d ON r.dataset = d.key WHERE d.population = ? AND {_SESSION} = ? "
                    "ORDER BY r.id",
                    (population, s)):
                purposes[p] = purposes.get(p, 0) + 1
                srcs.setdefault(key, {"key": key, "source": src, "content_sha256": digest, "records": int(records),
                                      "keyed": bool(keyed), "legacy": bool(legacy)})
            if plan is not None:
                kind = "federated plan"
            else:
                kind = "central tune run" if set(purposes) == {"tune"} else "central train run"
            life = self.lifetime(population, delta, session=s)
            out.append({"session": s, "kind": kind, "plan_sha256": plan, "first": _stamp(first), "last": _stamp(last),
                        "releases": int(n), "purposes": purposes, "epsilon": life.epsilon,
                        "sources": list(srcs.values())})
        return out


def _stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def summary(ledger: LifetimeLedger, delta: float = DEFAULT_LIFETIME_DELTA, releases: bool = False) -> dict:
    """Every account with its lifetime (ε, δ) at ``delta``, its sessions and its record sets (``releases``: every
    release too): what ``fedsbdt ledger --json`` prints."""
    out = []
    for p in ledger.populations():
        name = p["population"]
        lt = ledger.lifetime(name, delta)
        acct = {**p, "lifetime": {"epsilon": lt.epsilon, "delta": lt.delta, "records": lt.records,
                                  "releases": lt.releases},
                "sessions": ledger.sessions(name, delta),
                "sources": [{k: v for k, v in d.items() if k not in ("population",)}
                            for d in ledger.datasets(name)]}
        if releases:
            acct["releases"] = [{k: r[k] for k in ("when", "session", "plan_sha256", "purpose", "tree", "level",
                                                   "round_id", "records", "dataset", "epsilon", "delta", "event")}
                                for r in ledger.releases(name)]
        out.append(acct)
    return {"ledger": str(ledger.path), "lifetime_delta": float(delta), "populations": out}
