"""Coordinator checkpoints: the released model so far and the session state, crash-safe.

Layout of the state directory::

    session.log     append-only, one checksummed JSON record per line:
                    header (plan hash), the initial score, every released tree
                    (with its public record and the failed-round counter), finished
    secagg/         the secure-aggregation coordinator's storage (epoch and round
                    counters, ready epochs; common/secagg FileStorage)
    model.json      the final model (written atomically when the session finishes)

A record is appended and fsynced *before* the tree it describes is broadcast,
so everything any site has seen is on disk.  A crash can leave at most one
torn last line, which :meth:`CheckpointLog.load` drops (that tree was never
broadcast); a restarted coordinator resumes at the next tree.  Appending keeps
each checkpoint O(tree) instead of rewriting the whole model every round.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .wire import InitScoreMsg, TreeMsg


class CheckpointError(RuntimeError):
    """The state directory belongs to another plan or is corrupt beyond its last line."""


@dataclass
class Restored:
    init: InitScoreMsg | None = None
    has_init: bool = False
    trees: list[TreeMsg] = field(default_factory=list)
    rounds_failed: int = 0
    finished_sha256: str | None = None


def _line(obj: dict) -> bytes:
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return (body + "\t" + hashlib.sha256(body.encode()).hexdigest()[:32] + "\n").encode()


def _parse(line: bytes) -> dict | None:
    try:
        text = line.decode()
        body, check = text.rstrip("\n").rsplit("\t", 1)
    except (UnicodeDecodeError, ValueError):
        return None
    if not text.endswith("\n") or hashlib.sha256(body.encode()).hexdigest()[:32] != check:
        return None
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return None


def _tree_dict(t: TreeMsg, rounds_failed: int) -> dict:
    return {"kind": "tree", "index": t.index, "round_id": t.round_id, "sites": list(t.sites),
            "features": t.features.astype(int).tolist(), "thresholds": [float(x) for x in t.thresholds],
            "leaves": [float(x) for x in t.leaves], "rounds_failed": rounds_failed}


class CheckpointLog:
    """The append-only session log in ``directory`` for the plan with hash ``plan_sha256``."""

    NAME = "session.log"

    def __init__(self, directory: str | os.PathLike, plan_sha256: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.dir / self.NAME
        self.plan_sha256 = plan_sha256

    def load(self) -> Restored:
        """Read the log (dropping a torn last line); writes the header if the log is new."""
        out = Restored()
        if not self.path.exists():
            self._append({"kind": "header", "plan_sha256": self.plan_sha256})
            return out
        data = self.path.read_bytes()
        lines = data.splitlines(keepends=True)
        good = 0
        for i, line in enumerate(lines):
            rec = _parse(line)
            if rec is None:
                if i < len(lines) - 1:
                    raise CheckpointError(f"{self.path}: record {i + 1} is corrupt (not the last line); "
                                          "refusing to resume from a damaged checkpoint")
                break
            kind = rec.get("kind")
            if i == 0:
                if kind != "header":
                    raise CheckpointError(f"{self.path}: missing header")
                if rec.get("plan_sha256") != self.plan_sha256:
                    raise CheckpointError(f"{self.path} belongs to plan {rec.get('plan_sha256')}, not to "
                                          f"{self.plan_sha256}; use another --state directory for a new plan")
            elif kind == "init":
                out.has_init = True
                sites = tuple(rec["sites"])
                out.init = InitScoreMsg(float(rec["score"]), rec["round_id"], sites)
            elif kind == "tree":
                if rec["index"] != len(out.trees):
                    raise CheckpointError(f"{self.path}: tree {rec['index']} out of order")
                out.trees.append(TreeMsg(int(rec["index"]), int(rec["round_id"]), tuple(rec["sites"]),
                                         np.asarray(rec["features"], np.int32),
                                         np.asarray(rec["thresholds"], np.float64),
                                         np.asarray(rec["leaves"], np.float64)))
                out.rounds_failed = int(rec.get("rounds_failed", 0))
            elif kind == "finished":
                out.finished_sha256 = str(rec["model_sha256"])
            else:
                raise CheckpointError(f"{self.path}: unknown record kind {kind!r}")
            good += len(line)
        if good < len(data):  # drop a torn last line (never broadcast)
            with open(self.path, "r+b") as fh:
                fh.truncate(good)
                fh.flush()
                os.fsync(fh.fileno())
        return out

    def _append(self, obj: dict) -> None:
        line = _line(obj)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def append_init(self, init: InitScoreMsg) -> None:
        self._append({"kind": "init", "score": float(init.score), "round_id": init.round_id,
                      "sites": list(init.sites)})

    def append_tree(self, tree: TreeMsg, rounds_failed: int) -> None:
        self._append(_tree_dict(tree, rounds_failed))

    def finish(self, model_json: bytes, model_sha256: str) -> Path:
        """Write ``model.json`` atomically, then record the session as finished."""
        out = self.dir / "model.json"
        tmp = out.with_name(out.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(model_json)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(out)
        self._append({"kind": "finished", "model_sha256": model_sha256})
        return out
