"""A site's durable state in one SQLite database (WAL, ``synchronous=FULL``): ledger, log, secagg storage.

One database per site and plan (``<state>/ledger-<plan hash prefix>.sqlite``):

==================  ===========================================================
table               content
==================  ===========================================================
``ledger``          ``record_id`` → ``spent``: the per-record Rényi ledger in
                    integer ledger units (common/rdp_filter.py); a record that
                    appears later starts at 0, old records keep theirs
``contributions``   one row per masked input sent: round id, kind (``init`` /
                    ``tree`` / ``level``), tree index (and level), whether it
                    carried data, the (private) active and sampled counts
``released_splits`` level-round modes: the splits of each tree the coordinator
                    released so far (a later request may not rewrite them)
``secagg``          the secure-aggregation site's records (common/secagg
                    ``Storage``: keys, shares, "input sent", "signed", …)
``meta``            plan hash, site id, the stored initial-score vector (and,
                    central mode, the noise added to its retries), the stored
                    evaluation vector, its noise and the ε_eval charge record;
                    the mode's own state (:meth:`SiteLedger.mode_state`: keys
                    with a ``/``, named by the mode's module under
                    common/modes/, e.g. a partition of the records or a
                    per-tree subsample)
==================  ===========================================================

A database of an older version that holds rows in a table this version does
not know (mode state kept in a table of its own) is refused with one line:
finish that session with the version that began it, or start afresh.

The privacy-critical rule: the ledger update of round r, its contributions
row and secagg's ``round/<r>/input`` record are written in **one**
transaction (:meth:`SiteLedger.transaction`) that commits before the masked
vector is handed to the transport.  A site killed at any instant either
never sent round r, or has it charged.

Everything here is secret (keys, shares, ledger): the file is created 0600.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import numpy as np

from fedsbdt.common.secagg.errors import StorageError
from fedsbdt.common.secagg.storage import check_key
from fedsbdt.common.sqlite_tx import Transactions, connect

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (record_id INTEGER PRIMARY KEY, spent INTEGER NOT NULL CHECK (spent >= 0));
CREATE TABLE IF NOT EXISTS contributions (
    round_id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('init', 'tree', 'level', 'sketch')), tree INTEGER,
    with_data INTEGER NOT NULL, active INTEGER, sampled INTEGER, sent_at REAL NOT NULL, level INTEGER);
CREATE TABLE IF NOT EXISTS secagg (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS released_splits (
    tree INTEGER NOT NULL, node INTEGER NOT NULL, feature INTEGER NOT NULL, threshold REAL NOT NULL,
    PRIMARY KEY (tree, node));
"""
_TABLES = frozenset({"meta", "ledger", "contributions", "secagg", "released_splits"})


class LedgerError(RuntimeError):
    """The database belongs to another plan or site, or cannot be used."""


def ledger_path(state_dir: str | os.PathLike, plan_sha256: str) -> Path:
    return Path(state_dir) / f"ledger-{plan_sha256[:16]}.sqlite"


class SiteLedger:
    """The site's database; one connection, used from one thread."""

    def __init__(self, path: str | os.PathLike, plan_sha256: str, site_id: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        try:
            self.db = connect(self.path)
            self.db.executescript(_SCHEMA)
            if "level" not in {r[1] for r in self.db.execute("PRAGMA table_info(contributions)")}:
                self.db.execute("ALTER TABLE contributions ADD COLUMN level INTEGER")  # a database of an older version
            stale = [(t, n) for (t,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                     if t not in _TABLES and not t.startswith("sqlite_")
                     and (n := self.db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0])]
        except sqlite3.Error as e:
            raise LedgerError(f"{self.path}: cannot open the site database: {e}") from None
        if stale:
            self.db.close()
            raise LedgerError(f"{self.path} was written by an older fedsbdt version (its table {stale[0][0]!r} holds "
                              f"{stale[0][1]} rows this version does not read); finish that session with the "
                              "version that began it, or move the file away to start the plan afresh")
        self._tx = Transactions(self.db)
        for key, want in (("plan_sha256", plan_sha256), ("site_id", site_id)):
            have = self._meta(key)
            if have is None:
                self._set_meta(key, want.encode())
            elif have.decode() != want:
                raise LedgerError(f"{self.path} belongs to {key} {have.decode()!r}, not {want!r}")
        self.storage = SqliteStorage(self)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ transactions

    def transaction(self):
        """One durable transaction: commits (fsync) when the block ends, rolls back on an exception."""
        return self._tx.transaction()

    @property
    def in_transaction(self) -> bool:
        return self._tx.active

    # ------------------------------------------------------------------ meta

    def _meta(self, key: str) -> bytes | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _set_meta(self, key: str, value: bytes) -> None:
        with self.transaction():
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # ------------------------------------------------------------------ the Rényi ledger

    def ensure_records(self, ids: np.ndarray) -> None:
        """Give records not yet in the ledger a fresh budget (spent = 0); existing ones keep theirs."""
        with self.transaction():
            self.db.executemany("INSERT OR IGNORE INTO ledger (record_id, spent) VALUES (?, 0)",
                                ((int(i),) for i in np.asarray(ids, dtype=np.int64)))

    def spent_for(self, ids: np.ndarray) -> np.ndarray:
        """Spent ledger units of ``ids`` (in that order)."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = self.db.execute("SELECT record_id, spent FROM ledger").fetchall()
        if not rows:
            return np.zeros(ids.shape, np.int64)
        rid = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        sp = np.fromiter((r[1] for r in rows), np.int64, len(rows))
        order = np.argsort(rid)
        rid, sp = rid[order], sp[order]
        pos = np.clip(np.searchsorted(rid, ids), 0, len(rid) - 1)
        found = rid[pos] == ids
        return np.where(found, sp[pos], 0)

    def charge(self, ids: np.ndarray, old: np.ndarray, new: np.ndarray) -> int:
        """Write the records whose spent units changed (inside the round's transaction); returns their number."""
        if not self.in_transaction:
            raise LedgerError("ledger updates must be part of the round's transaction")
        changed = np.flatnonzero(np.asarray(new) != np.asarray(old))
        if changed.size and int(np.min(np.asarray(new)[changed] - np.asarray(old)[changed])) < 0:
            raise LedgerError("a ledger update may only increase spent units")
        self.db.executemany("UPDATE ledger SET spent = ? WHERE record_id = ?",
                            zip(np.asarray(new)[changed].tolist(), np.asarray(ids)[changed].tolist()))
        return int(changed.size)

    def all_spent(self) -> dict[int, int]:
        return dict(self.db.execute("SELECT record_id, spent FROM ledger").fetchall())

    # ------------------------------------------------------------------ contribution log

    def log_contribution(self, round_id: int, kind: str, tree: int | None, with_data: bool, active: int | None,
                         sampled: int | None, level: int | None = None) -> None:
        if not self.in_transaction:
            raise LedgerError("the contribution log must be part of the round's transaction")
        self.db.execute("INSERT INTO contributions (round_id, kind, tree, with_data, active, sampled, sent_at, level) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (int(round_id), kind, tree, int(bool(with_data)), active, sampled, time.time(), level))

    def level_contributions(self) -> int:
        """Level rounds in which this site sent data (each costs one accounted level, retries included)."""
        return int(self.db.execute(
            "SELECT COUNT(*) FROM contributions WHERE kind = 'level' AND with_data = 1").fetchone()[0])

    def level_attempts(self, tree: int, level: int) -> int:
        """Masked inputs this site sent for level ``level`` of tree ``tree`` (every attempt)."""
        return int(self.db.execute("SELECT COUNT(*) FROM contributions WHERE kind = 'level' AND tree = ? AND level = ?",
                                   (int(tree), int(level))).fetchone()[0])

    # ------------------------------------------------------------------ level-round modes: released splits

    def released_splits(self, tree: int) -> tuple[np.ndarray, np.ndarray]:
        """(features, thresholds) of tree ``tree``'s splits seen in the coordinator's requests, heap order."""
        rows = self.db.execute("SELECT feature, threshold FROM released_splits WHERE tree = ? ORDER BY node",
                               (int(tree),)).fetchall()
        return (np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.float64))

    def remember_splits(self, tree: int, features, thresholds) -> None:
        """Record the splits a request carried (those already recorded are kept; the caller checked them)."""
        if not self.in_transaction:
            raise LedgerError("released splits must be recorded in the round's transaction")
        self.db.executemany("INSERT OR IGNORE INTO released_splits (tree, node, feature, threshold) VALUES (?, ?, ?, ?)",
                            ((int(tree), i, int(f), float(t)) for i, (f, t) in enumerate(zip(features, thresholds))))

    # ------------------------------------------------------------------ the mode's own state (common/modes)

    @staticmethod
    def _mode_key(key: str) -> str:
        if not isinstance(key, str) or "/" not in key:
            raise LedgerError(f"a mode's state key names its mode's namespace ('name/...'), not {key!r}")
        return key

    def mode_state(self, key: str) -> bytes | None:
        """The mode's state stored under ``key`` (the mode's module names its keys), or None."""
        return self._meta(self._mode_key(key))

    def set_mode_state(self, key: str, blob: bytes) -> None:
        """Store the mode's state under ``key`` once (durable before anything that depends on it is sent: its own
        transaction, or the round's); it is never drawn twice."""
        if self.mode_state(key) is not None:
            raise LedgerError(f"the mode's state {key!r} is already stored; it is never drawn twice")
        self._set_meta(self._mode_key(key), bytes(blob))

    def keep_mode_state(self, key: str, blob: bytes) -> None:
        """Record ``blob`` under ``key`` in the round's transaction, unless a value is stored (the first stays)."""
        if not self.in_transaction:
            raise LedgerError("a mode's state must be recorded in the round's transaction")
        self.db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (self._mode_key(key), bytes(blob)))

    # ------------------------------------------------------------------ attempts per stage

    def attempts(self, kind: str, tree: int, level: int | None = None, with_data: bool = False) -> int:
        """Masked inputs this site sent for one stage of tree ``tree`` (every attempt; ``with_data``: those
        that carried its data)."""
        return int(self.db.execute(
            "SELECT COUNT(*) FROM contributions WHERE kind = ? AND tree = ? AND level IS ? AND with_data >= ?",
            (kind, int(tree), level, int(with_data))).fetchone()[0])

    def attempts_any(self, kind: str, tree: int | None, level: int | None = None) -> int:
        """Masked inputs this site sent for one stage (``kind``, ``tree``, ``level``), with or without data."""
        return int(self.db.execute("SELECT COUNT(*) FROM contributions WHERE kind = ? AND tree IS ? AND level IS ?",
                                   (kind, tree, level)).fetchone()[0])

    def failed_attempts(self) -> int:
        """Attempts the coordinator did not release: every masked input after the first of its stage."""
        return failed_attempts(self.db)

    def tree_contributions(self) -> int:
        """Tree rounds in which this site sent data (each costs one accounted round, retries included)."""
        return int(self.db.execute(
            "SELECT COUNT(*) FROM contributions WHERE kind = 'tree' AND with_data = 1").fetchone()[0])

    def init_contributions(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM contributions WHERE kind = 'init'").fetchone()[0])

    def tree_attempts(self, tree: int) -> int:
        """Masked inputs this site sent for tree ``tree`` (every attempt of that logical round)."""
        return int(self.db.execute("SELECT COUNT(*) FROM contributions WHERE kind = 'tree' AND tree = ?",
                                   (int(tree),)).fetchone()[0])

    # ------------------------------------------------------------------ the initial-score vector

    def init_vector(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The initial-score vector and noise share this site committed to (resent unchanged on retries)."""
        x = self._meta("init_x")
        if x is None:
            return None
        noise = self._meta("init_noise")
        return (np.frombuffer(x, dtype="<i8").astype(np.int64),
                None if noise is None or not noise else np.frombuffer(noise, dtype="<i8").astype(np.int64))

    def init_retry_noise(self) -> np.ndarray | None:
        """Central mode: the full discrete-Laplace vector this site adds to every *retry* of the initial score."""
        v = self._meta("init_retry_noise")
        return None if v is None else np.frombuffer(v, dtype="<i8").astype(np.int64)

    def set_init_retry_noise(self, noise: np.ndarray) -> None:
        if not self.in_transaction:
            raise LedgerError("the retry noise must be part of the round's transaction")
        self.db.execute("INSERT INTO meta (key, value) VALUES ('init_retry_noise', ?)",
                        (np.asarray(noise, dtype="<i8").tobytes(),))

    def set_init_vector(self, x: np.ndarray, noise: np.ndarray | None) -> None:
        if not self.in_transaction:
            raise LedgerError("the initial-score vector must be part of the round's transaction")
        self.db.execute("INSERT INTO meta (key, value) VALUES ('init_x', ?)",
                        (np.asarray(x, dtype="<i8").tobytes(),))
        self.db.execute("INSERT INTO meta (key, value) VALUES ('init_noise', ?)",
                        (b"" if noise is None else np.asarray(noise, dtype="<i8").tobytes(),))

    # ------------------------------------------------------------------ the federated evaluation

    def eval_vector(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The evaluation vector and noise share this site committed to (resent unchanged on retries)."""
        x, noise = self._meta("eval_x"), self._meta("eval_noise")
        if x is None or noise is None:
            return None
        return np.frombuffer(x, dtype="<i8").astype(np.int64), np.frombuffer(noise, dtype="<i8").astype(np.int64)

    def eval_charge(self) -> dict | None:
        """The ε_eval charge of this site's held-out file (one release, however often the round is retried)."""
        v = self._meta("eval_charge")
        return None if v is None else json.loads(v.decode())

    def set_eval_vector(self, x: np.ndarray, noise: np.ndarray, charge: dict) -> None:
        if not self.in_transaction:
            raise LedgerError("the evaluation vector must be part of the round's transaction")
        for key, value in (("eval_x", np.asarray(x, dtype="<i8").tobytes()),
                           ("eval_noise", np.asarray(noise, dtype="<i8").tobytes()),
                           ("eval_charge", json.dumps(charge, sort_keys=True).encode())):
            self.db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))


def failed_attempts(db: sqlite3.Connection) -> int:
    """Failed attempts in a site database (``db``: any connection to it, read-only included): every masked input
    after the first of its stage (kind, tree, level)."""
    return int(db.execute(
        "SELECT COUNT(*) - (SELECT COUNT(*) FROM (SELECT DISTINCT kind, tree, level FROM contributions)) "
        "FROM contributions").fetchone()[0])


class SqliteStorage:
    """fedsbdt.common.secagg ``Storage`` in the site database: a ``put`` joins the open transaction or commits its own."""

    def __init__(self, ledger: SiteLedger) -> None:
        self._l = ledger

    def get(self, key: str) -> bytes | None:
        try:
            row = self._l.db.execute("SELECT value FROM secagg WHERE key = ?", (check_key(key),)).fetchone()
        except sqlite3.Error as e:
            raise StorageError(f"cannot read {key!r}: {e}") from None
        return None if row is None else bytes(row[0])

    def put(self, key: str, value: bytes) -> None:
        if not isinstance(value, (bytes, bytearray)):
            raise StorageError("storage values must be bytes")
        try:
            with self._l.transaction():
                self._l.db.execute("INSERT OR REPLACE INTO secagg (key, value) VALUES (?, ?)",
                                   (check_key(key), bytes(value)))
        except sqlite3.Error as e:
            raise StorageError(f"cannot write {key!r}: {e}") from None

    def delete(self, key: str) -> None:
        try:
            with self._l.transaction():
                self._l.db.execute("DELETE FROM secagg WHERE key = ?", (check_key(key),))
        except sqlite3.Error as e:
            raise StorageError(f"cannot delete {key!r}: {e}") from None

    def keys(self, prefix: str = "") -> list[str]:
        rows = self._l.db.execute("SELECT key FROM secagg WHERE substr(key, 1, ?) = ? ORDER BY key",
                                  (len(prefix), prefix)).fetchall()
        return [r[0] for r in rows]
