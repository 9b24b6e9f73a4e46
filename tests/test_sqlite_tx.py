"""The one SQLite transaction helper of the site's ledger and the coordinator's checkpoint
(common/sqlite_tx.py): nested blocks commit together, an exception rolls back everything, a lazy store
begins at its first write only."""
import sqlite3

import pytest

from fedsbdt.common.sqlite_tx import Transactions, connect


def _db(tmp_path):
    db = connect(tmp_path / "t.sqlite")
    db.execute("CREATE TABLE t (x INTEGER)")
    return db


def _rows(path):
    other = sqlite3.connect(path)  # a second reader sees committed rows only
    try:
        return [x for (x,) in other.execute("SELECT x FROM t ORDER BY x")]
    finally:
        other.close()


@pytest.mark.parametrize("lazy", [False, True])
def test_nested_blocks_commit_together_at_the_outermost_end(tmp_path, lazy):
    db, tx = _db(tmp_path), None
    tx = Transactions(db, lazy=lazy)
    with tx.transaction():
        tx.begin()
        db.execute("INSERT INTO t VALUES (1)")
        with tx.transaction():
            db.execute("INSERT INTO t VALUES (2)")
        assert tx.active and _rows(tmp_path / "t.sqlite") == []  # the inner block's end commits nothing
    assert not tx.active and _rows(tmp_path / "t.sqlite") == [1, 2]


@pytest.mark.parametrize("lazy", [False, True])
def test_an_exception_in_an_inner_block_rolls_back_the_whole_transaction(tmp_path, lazy):
    db = _db(tmp_path)
    tx = Transactions(db, lazy=lazy)
    with pytest.raises(RuntimeError, match="boom"):
        with tx.transaction():
            tx.begin()
            db.execute("INSERT INTO t VALUES (1)")
            with tx.transaction():
                db.execute("INSERT INTO t VALUES (2)")
                raise RuntimeError("boom")
    assert not tx.active and not db.in_transaction and _rows(tmp_path / "t.sqlite") == []
    with tx.transaction():  # usable again
        tx.begin()
        db.execute("INSERT INTO t VALUES (3)")
    assert _rows(tmp_path / "t.sqlite") == [3]


def test_a_lazy_block_that_writes_nothing_begins_no_transaction(tmp_path):
    db = _db(tmp_path)
    tx = Transactions(db, lazy=True)
    with tx.transaction():
        assert not db.in_transaction
        tx.begin()
        assert db.in_transaction
    eager = Transactions(db)
    with eager.transaction():
        assert db.in_transaction  # the site's store holds the write lock for the whole block


def test_begin_outside_a_block_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="outside"):
        Transactions(_db(tmp_path)).begin()
