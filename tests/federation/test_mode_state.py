"""The site database's store for a mode's own state (client/ledger.py ``mode_state``): keys the mode names,
written once, never replaced; a database of an older version that kept a mode's state in a table of its own
is refused with one line rather than read as if it held none (a redrawn subsample or partition would put a
record into releases the plan does not account)."""
from __future__ import annotations

import sqlite3

import pytest

from fedsbdt.client.ledger import LedgerError, SiteLedger

PLAN = "ab" * 32


def test_mode_state_is_written_once_and_kept(tmp_path):
    led = SiteLedger(tmp_path / "l.sqlite", PLAN, "hosp-a")
    assert led.mode_state("m/0") is None
    led.set_mode_state("m/0", b"first")
    with pytest.raises(LedgerError, match="never drawn twice"):
        led.set_mode_state("m/0", b"second")
    with pytest.raises(LedgerError, match="round's transaction"):
        led.keep_mode_state("m/1", b"x")
    with led.transaction():
        led.keep_mode_state("m/1", b"one")
        led.keep_mode_state("m/1", b"two")  # the first value stays
    with pytest.raises(LedgerError, match="namespace"):
        led.mode_state("plan_sha256")  # the ledger's own keys are not a mode's
    led.close()
    led = SiteLedger(tmp_path / "l.sqlite", PLAN, "hosp-a")  # durable
    assert (led.mode_state("m/0"), led.mode_state("m/1")) == (b"first", b"one")
    led.close()


def test_a_database_of_an_older_version_with_a_mode_table_is_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE sarus_trees (tree INTEGER PRIMARY KEY, records INTEGER NOT NULL, "
               "subsample BLOB NOT NULL, sketch BLOB)")  # what an older version created for every plan
    db.commit()
    SiteLedger(path, PLAN, "hosp-a").close()  # empty: nothing of it was ever used
    db.execute("INSERT INTO sarus_trees (tree, records, subsample) VALUES (0, 3, x'a0')")
    db.commit()
    db.close()
    with pytest.raises(LedgerError) as e:
        SiteLedger(path, PLAN, "hosp-a")
    assert "older fedsbdt version (its table 'sarus_trees' holds 1 rows" in str(e.value)
    assert "\n" not in str(e.value)
