"""Durable, nestable SQLite transactions: the site's ledger (:mod:`fedsbdt.client.ledger`) and the coordinator's
checkpoint (:mod:`fedsbdt.server.checkpoint`) write through one :class:`Transactions` each.

The connection runs in autocommit mode (``isolation_level=None``) with a write-ahead log and
``synchronous=FULL`` (:func:`connect`), so a COMMIT is durable (fsynced) when it returns.  Blocks nest:
everything written inside the outermost one commits together, or, on an exception, rolls back together.
"""
from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection for :class:`Transactions`: autocommit (transactions are explicit), usable from the thread
    that owns the store though not the one that opened it, write-ahead log, fsync at every commit."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


class Transactions:
    """Nested transactions over ``db`` (a :func:`connect` connection), one writer.

    ``lazy=False``: the outermost block begins ``BEGIN IMMEDIATE`` at once (the site: its reads inside a block
    see the state it then writes).  ``lazy=True``: the transaction begins at the block's first :meth:`begin`
    (a write; the coordinator: most of its steps write nothing, and then cost no BEGIN/COMMIT at all — it is
    its database's only writer, so reads before that write see the same state)."""

    def __init__(self, db: sqlite3.Connection, *, lazy: bool = False) -> None:
        self.db, self.lazy = db, lazy
        self.depth = 0  # nesting of the blocks now open
        self.begun = False  # a BEGIN was executed in the current outermost block

    @contextmanager
    def transaction(self):
        """One durable transaction: commits (fsync) when the outermost block ends, rolls back on an exception."""
        if self.depth:
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            return
        if not self.lazy:
            self.db.execute("BEGIN IMMEDIATE")
        self.depth, self.begun = 1, not self.lazy
        try:
            yield
        except BaseException:
            self.depth = 0
            if self.begun:
                self.begun = False
                self.db.execute("ROLLBACK")
            raise
        self.depth = 0
        if self.begun:
            self.begun = False
            self.db.execute("COMMIT")

    def begin(self) -> None:
        """Inside a block: make sure its SQLite transaction has begun (before its first write)."""
        if not self.depth:
            raise RuntimeError("begin() outside a transaction block")
        if not self.begun:
            self.db.execute("BEGIN IMMEDIATE")
            self.begun = True

    @property
    def active(self) -> bool:
        """Whether a block is open."""
        return self.depth > 0
