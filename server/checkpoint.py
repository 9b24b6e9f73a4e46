"""Coordinator checkpoints: the released model so far and the session state, in one SQLite database.

``<state>/coordinator.sqlite`` (WAL, ``synchronous=FULL``)::

    log      one row per released fact, in order: the header (plan hash), the
             initial score, every released tree (with its public record
             ``{tree, round_id, sites}`` and the failed-round counter), the
             released steps of the tree in progress (a mode's rounds before
             its leaves: ``level``, ``sketch``; common/modes/coordinator.py),
             finished
    secagg   the secure-aggregation coordinator's storage (epoch and round-id
             counters, ready epochs: common/secagg Storage)

The session runs each of its steps inside :meth:`CoordinatorStore.transaction`
and hands its outgoing events to the transport only after the commit, so a
tree is durable before any site sees it, and the tree, the next round's id
and the epoch bookkeeping commit atomically with one fsync.  A restarted
coordinator reads the log and resumes at the next tree; the round that was in
flight is retried under a new round id.  The final model is also written to
``<state>/model.json`` (atomic rename).
"""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsbdt.common.secagg.errors import StorageError
from fedsbdt.common.secagg.storage import check_key
from fedsbdt.common.sqlite_tx import Transactions, connect

from fedsbdt.common.federation.wire import InitScoreMsg, TreeMsg

_SCHEMA = """
CREATE TABLE IF NOT EXISTS log (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS secagg (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS join_nonces (site TEXT NOT NULL, nonce BLOB NOT NULL, PRIMARY KEY (site, nonce));
"""


#: the log's records of a tree's rounds before its leaves: the round purposes' names (a level's record also
#: carries its level; every other kind is once per tree)
STEP_KINDS = ("level", "sketch")


class CheckpointError(RuntimeError):
    """The state directory belongs to another plan or is corrupt."""


@dataclass
class Restored:
    init: InitScoreMsg | None = None
    has_init: bool = False
    trees: list[TreeMsg] = field(default_factory=list)
    rounds_failed: int = 0
    finished_sha256: str | None = None
    # the released steps of the tree in progress, in order: (kind, record) for the mode's TreeRounds.apply
    steps: list[tuple[str, dict]] = field(default_factory=list)


class CoordinatorStore:
    """The coordinator's durable state for the plan with hash ``plan_sha256``."""

    NAME = "coordinator.sqlite"

    def __init__(self, directory: str | os.PathLike, plan_sha256: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.dir / self.NAME
        self.plan_sha256 = plan_sha256
        try:
            self.db = connect(self.path)
            self.db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise CheckpointError(f"{self.path}: cannot open the coordinator database: {e}") from None
        self._tx = Transactions(self.db, lazy=True)
        self.storage = _SecAggStorage(self)

    # ------------------------------------------------------------------ transactions

    def transaction(self):
        """Everything written inside commits together (one fsync) when the outermost block ends.

        The SQLite transaction begins at the first write (:meth:`_write`): most session steps (a
        signature or a share arriving) write nothing, and then cost no BEGIN/COMMIT at all.  The
        coordinator is the only writer of its database, so reads before that write see the same state.
        """
        return self._tx.transaction()

    def _write(self, sql: str, params: tuple) -> sqlite3.Cursor:
        """Execute one write inside the current transaction (opening it), or in its own one."""
        with self.transaction():
            self._tx.begin()
            return self.db.execute(sql, params)

    def _append(self, kind: str, obj: dict) -> None:
        self._write("INSERT INTO log (kind, body) VALUES (?, ?)",
                    (kind, json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)))

    # ------------------------------------------------------------------ the log

    def load(self) -> Restored:
        """Read the log; a new database gets its header."""
        rows = self.db.execute("SELECT kind, body FROM log ORDER BY seq").fetchall()
        out = Restored()
        if not rows:
            self._append("header", {"plan_sha256": self.plan_sha256})
            return out
        try:
            for i, (kind, body) in enumerate(rows):
                rec = json.loads(body)
                if i == 0:
                    if kind != "header":
                        raise CheckpointError(f"{self.path}: missing header")
                    if rec.get("plan_sha256") != self.plan_sha256:
                        raise CheckpointError(f"{self.path} belongs to plan {rec.get('plan_sha256')}, not to "
                                              f"{self.plan_sha256}; use another --state directory for a new plan")
                elif kind == "init":
                    out.has_init = True
                    out.init = InitScoreMsg(float(rec["score"]), rec["round_id"], tuple(rec["sites"]),
                                            tuple(float(x) for x in rec.get("scores", ())))
                elif kind == "tree":
                    if rec["index"] != len(out.trees):
                        raise CheckpointError(f"{self.path}: tree {rec['index']} out of order")
                    out.trees.append(TreeMsg(int(rec["index"]), int(rec["round_id"]), tuple(rec["sites"]),
                                             np.asarray(rec["features"], np.int32),
                                             np.asarray(rec["thresholds"], np.float64),
                                             np.asarray(rec["leaves"], np.float64)))
                    out.rounds_failed = int(rec.get("rounds_failed", 0))
                    out.steps = []
                elif kind in STEP_KINDS:
                    done = [k for k, _ in out.steps]
                    if kind == "level":
                        if (rec["tree"], rec["level"]) != (len(out.trees), done.count("level")):
                            raise CheckpointError(f"{self.path}: level {rec['level']} of tree {rec['tree']} out of order")
                    elif rec["tree"] != len(out.trees) or kind in done:
                        raise CheckpointError(f"{self.path}: {kind} of tree {rec['tree']} out of order")
                    out.steps.append((kind, rec))
                    out.rounds_failed = int(rec.get("rounds_failed", 0))
                elif kind == "finished":
                    out.finished_sha256 = str(rec["model_sha256"])
                else:
                    raise CheckpointError(f"{self.path}: unknown record kind {kind!r}")
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{self.path}: corrupt checkpoint record ({e})") from None
        return out

    def append_init(self, init: InitScoreMsg) -> None:
        rec = {"score": float(init.score), "round_id": init.round_id, "sites": list(init.sites)}
        if init.scores:  # multiclass
            rec["scores"] = [float(x) for x in init.scores]
        self._append("init", rec)

    def append_tree(self, tree: TreeMsg, rounds_failed: int) -> None:
        self._append("tree", {"index": tree.index, "round_id": tree.round_id, "sites": list(tree.sites),
                              "features": tree.features.astype(int).tolist(),
                              "thresholds": [float(x) for x in tree.thresholds],
                              "leaves": [float(x) for x in tree.leaves], "rounds_failed": rounds_failed})

    def append_step(self, kind: str, tree: int, level: int, round_id: int, sites, record: dict,
                    rounds_failed: int) -> None:
        """A released step of the tree in progress (``kind`` in :data:`STEP_KINDS`; ``record`` the mode's JSON),
        durable before any later request carries it."""
        if kind not in STEP_KINDS:
            raise ValueError(f"{kind!r} is not a step kind ({', '.join(STEP_KINDS)})")
        rec = {"tree": tree, "round_id": round_id, "sites": list(sites), "rounds_failed": rounds_failed} | \
            ({"level": level} if kind == "level" else {}) | record
        self._append(kind, rec)

    def finish(self, model_json: bytes, model_sha256: str) -> Path:
        """Write ``model.json`` atomically, then record the session as finished."""
        out = self.dir / "model.json"
        tmp = out.with_name(out.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(model_json)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(out)
        self._append("finished", {"model_sha256": model_sha256})
        return out

    def remember_join_nonce(self, site: str, nonce: bytes) -> bool:
        """Record the nonce of a signed Join; False if this site used it before (a replayed Join)."""
        cur = self._write("INSERT OR IGNORE INTO join_nonces (site, nonce) VALUES (?, ?)", (site, bytes(nonce)))
        return cur.rowcount == 1

    def close(self) -> None:
        self.db.close()


class _SecAggStorage:
    """fedsbdt.common.secagg ``Storage`` in the coordinator database (a put joins the open transaction)."""

    def __init__(self, store: CoordinatorStore) -> None:
        self._s = store

    def get(self, key: str) -> bytes | None:
        row = self._s.db.execute("SELECT value FROM secagg WHERE key = ?", (check_key(key),)).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, key: str, value: bytes) -> None:
        try:
            self._s._write("INSERT OR REPLACE INTO secagg (key, value) VALUES (?, ?)", (check_key(key), bytes(value)))
        except sqlite3.Error as e:
            raise StorageError(f"cannot write {key!r}: {e}") from None

    def delete(self, key: str) -> None:
        self._s._write("DELETE FROM secagg WHERE key = ?", (check_key(key),))

    def keys(self, prefix: str = "") -> list[str]:
        rows = self._s.db.execute("SELECT key FROM secagg WHERE substr(key, 1, ?) = ? ORDER BY key",
                                  (len(prefix), prefix)).fetchall()
        return [r[0] for r in rows]
