"""One lifetime account per site population (issue 37, findings 2 and 5; common/lifetime.py, client/gate.py).

Every release a site makes from its state directory — a federated plan's rounds, central ``fedsbdt train
--ledger`` and ``fedsbdt tune --ledger`` — charges one account, whatever file, format, row order, query, URL
or schema the records came through; with an ``id_column`` a record's cost composes every release that read
its id.  The lifetime ε is computed at the operator's ``--lifetime-delta``, never at a release's δ.  Real
SQLite, the real CLI (``fedsbdt.cli.main``), real PostgreSQL (tests/postgres_server.py), in-process
federations of real site machines; every number against dp-accounting's RDP accountant.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import sqlite3
from pathlib import Path

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from dp_accounting.rdp import RdpAccountant

from fedsbdt.client.policy import SitePolicy
from fedsbdt.client.site import SiteRefusal
from fedsbdt.cli import main
from fedsbdt.common.config import Hyperparameters

from postgres_server import PASSWORD, load_frame
from test_data import TOY

from .conftest import EXAMPLES
from .test_gate import GateFed, random_events_dp

ORDERS = [1 + x / 20 for x in range(1, 100)] + list(range(6, 64)) + [80, 100, 128, 192, 256, 384, 512]
LIFETIME_DELTA = 1e-6  # the documented default of --lifetime-delta
FIXTURE = Path(__file__).resolve().parents[1] / "data" / "lifetime-v1"
RUN = ["--settings", "paper", "--trees", "2", "--depth", "2", "--quiet", "--json"]


def cli(*args) -> tuple[int, str, str]:
    """``fedsbdt ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def dp_epsilon(events: list, delta: float) -> float:
    acc = RdpAccountant(ORDERS)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


def run_events(model_path: Path) -> list:
    """dp-accounting's events of one central random-tree run, from its model's privacy receipt."""
    model = json.loads(Path(model_path).read_text())
    p, hp = model["privacy"], model["hyperparameters"]
    ev = [dp_accounting.LaplaceDpEvent(1 / e) for e in (p["eps_init"], p["eps_ds"]) if e > 0]
    tree = dp_accounting.PoissonSampledDpEvent(hp["subsample"],
                                               dp_accounting.GaussianDpEvent(p["sigma"] / math.sqrt(2)))
    return ev + [dp_accounting.SelfComposedDpEvent(tree, hp["trees"])]


def cohort(n: int = 100, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"pid": 1000 + 7 * np.arange(n), "age": rng.integers(0, 100, n) + 0.5,
                         "ward": rng.choice(["A", "B"], n), "label": rng.choice(["yes", "no"], n)})


def variants(tmp: Path) -> dict[str, Path]:
    """The same 100 records as bytes that differ: LF, CRLF, rows reordered, one new record added."""
    tmp.mkdir(parents=True, exist_ok=True)
    frame = cohort()
    out = {"base": tmp / "base.csv", "crlf": tmp / "crlf.csv", "reordered": tmp / "reordered.csv",
           "plus_one": tmp / "plus_one.csv"}
    frame.to_csv(out["base"], index=False)
    frame.to_csv(out["crlf"], index=False, lineterminator="\r\n")
    frame.sample(frac=1.0, random_state=1).to_csv(out["reordered"], index=False)
    new = pd.DataFrame({"pid": [99_999], "age": [41.5], "ward": ["B"], "label": ["yes"]})
    pd.concat([frame, new]).to_csv(out["plus_one"], index=False)
    (tmp / "schema.toml").write_text(TOY)
    (tmp / "schema-no-id.toml").write_text(TOY.replace('id_column = "pid"\n', ""))
    return out


def ledger_json(state: Path, *more) -> dict:
    rc, out, err = cli("ledger", "--state", state, "--json", *more)
    assert rc == 0, err
    return json.loads(out)


def train(state: Path, data, schema: Path, out: Path, epsilon: float, *more) -> tuple[int, dict | None, str]:
    rc, stdout, err = cli("train", "--data", data, "--schema", schema, "--out", out, "--epsilon", epsilon, *RUN,
                          "--ledger", state, *more)
    return rc, (json.loads(stdout) if rc == 0 else None), err


# --------------------------------------------------------------------------- finding 2: one account


def test_six_identity_variants_of_the_same_records_land_in_one_account(tmp_path, postgres, monkeypatch):
    """The audit's variants — CRLF, reordered rows, one new record added, ``--query`` over the same file, a
    schema without id_column, the same PostgreSQL table as 127.0.0.1 / localhost / the socket — all charge
    one account; the worst record (read by all nine runs) costs their composition, and a tenth run over the
    cap is refused (before: nine accounts of one run each, and the tenth was accepted)."""
    files = variants(tmp_path / "data")
    schema, no_id = tmp_path / "data" / "schema.toml", tmp_path / "data" / "schema-no-id.toml"
    url = postgres.create_database("lifetime_variants")
    load_frame(url, "cohort", cohort())
    tcp = postgres.tcp_url("lifetime_variants")
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{postgres.port}:lifetime_variants:fedsbdt:{PASSWORD}\n"
                      f"localhost:{postgres.port}:lifetime_variants:fedsbdt:{PASSWORD}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    query = "SELECT pid, age, ward, label FROM cohort"
    runs = [([files["base"]], schema), ([files["crlf"]], schema), ([files["reordered"]], schema),
            ([files["plus_one"]], schema), ([files["base"], "--query", "SELECT * FROM data"], schema),
            ([files["base"]], no_id),
            ([tcp, "--query", query], schema),
            ([tcp.replace("127.0.0.1", "localhost"), "--query", query], schema),
            ([url, "--query", query], schema)]
    state = tmp_path / "state"
    events = []
    for i, (data, s) in enumerate(runs):
        rc, out, err = train(state, data[0], s, tmp_path / f"m{i}.json", 0.5, *data[1:])
        assert rc == 0, err
        events += run_events(tmp_path / f"m{i}.json")
    nine = dp_epsilon(events, LIFETIME_DELTA)
    ten = dp_epsilon(events + run_events(tmp_path / "m0.json"), LIFETIME_DELTA)
    assert ten > nine * 1.02
    before = sqlite3.connect(state / "lifetime.sqlite").execute("SELECT COUNT(*) FROM releases").fetchone()[0]
    # a tenth run, on the very first file, would bring the worst record past a cap between nine and ten runs
    rc, out, err = train(state, files["base"], schema, tmp_path / "m10.json", 0.5, "--lifetime-epsilon",
                         f"{(nine + ten) / 2:.6f}")
    assert rc == 2, "a tenth run over the cap was accepted: the nine runs were not in one account"
    assert len(err.strip().splitlines()) == 1 and "--lifetime-epsilon" in err and "nothing was trained" in err
    assert not (tmp_path / "m10.json").exists()
    assert sqlite3.connect(state / "lifetime.sqlite").execute("SELECT COUNT(*) FROM releases").fetchone()[0] == before
    now = float(re.search(r"\(now ([0-9.]+)", err).group(1))
    assert now == pytest.approx(nine, rel=0.02) and now >= nine * (1 - 1e-9)
    # the ledger: one account, nine sessions, the provenance of each (nine record sets, eight distinct digests:
    # the base file read with and without its id column is one file)
    d = ledger_json(state)
    (acct,) = d["populations"]
    assert acct["population"] == "default" and not acct["declared"]
    assert len(acct["sessions"]) == 9 and all(s["releases"] == 1 for s in acct["sessions"])
    assert acct["lifetime"]["epsilon"] == pytest.approx(nine, rel=0.02) and acct["lifetime"]["delta"] == LIFETIME_DELTA
    assert len(acct["sources"]) == 9 and len({s["content_sha256"] for s in acct["sources"]}) == 8
    assert sum(not s["keyed"] for s in acct["sources"]) == 1  # the schema without id_column
    assert acct["lifetime"]["records"] == 101  # the 100 records and the one added
    rc, text, _ = cli("ledger", "--state", state)
    assert rc == 0 and text.count("population default") == 1 and text.count("central train run") == 9


def test_two_runs_on_changed_bytes_compose(tmp_path):
    """Two ε = 1 runs on the same records (the second file reordered with CRLF line ends) cost the worst
    record the composition of both (dp-accounting), not one run's ε (before: two accounts of one run each); a
    third run on the file plus one record sees both."""
    files = variants(tmp_path / "data")
    schema = tmp_path / "data" / "schema.toml"
    frame = cohort()
    frame.sample(frac=1.0, random_state=4).to_csv(tmp_path / "data" / "both.csv", index=False, lineterminator="\r\n")
    state = tmp_path / "state"
    for i, data in enumerate((files["base"], tmp_path / "data" / "both.csv")):
        rc, out, err = train(state, data, schema, tmp_path / f"m{i}.json", 1.0)
        assert rc == 0, err
    two = dp_epsilon(run_events(tmp_path / "m0.json") + run_events(tmp_path / "m1.json"), LIFETIME_DELTA)
    one = dp_epsilon(run_events(tmp_path / "m0.json"), LIFETIME_DELTA)
    assert two > 1.2 * one
    rc, out, err = train(state, files["plus_one"], schema, tmp_path / "m2.json", 1.0, "--lifetime-epsilon", 1.05)
    assert rc == 2, "the third run was accepted: the first two were not in its account"
    now = float(re.search(r"\(now ([0-9.]+)", err).group(1))
    assert now == pytest.approx(two, rel=0.02) and now >= two * (1 - 1e-9)
    life = ledger_json(state)["populations"][0]["lifetime"]
    assert life["epsilon"] == pytest.approx(two, rel=0.02) and life["epsilon"] > 1.2 * one  # two runs, not one


# --------------------------------------------------------------------------- finding 5: the lifetime δ


def test_a_release_with_a_large_delta_never_lowers_the_lifetime_epsilon(tmp_path):
    """A federated plan of ε = 1, then a tiny plan at δ = 1e-2 on the same site: the lifetime ε rises (the
    composition converted at --lifetime-delta; before, it fell, converted at the tiny plan's δ).  A central
    run stated only as (ε, δ) with δ = 1e-2 cannot fit the lifetime δ: refused."""
    hp = Hyperparameters(trees=2, depth=2, seed=5, epsilon=1.0, init_share=0.0)
    f = GateFed(tmp_path, hp).start()
    f.fed.run()
    assert f.session.exit_code == 0
    before = f.machines["hosp-a"].receipt()["lifetime"]["train"]["epsilon"]
    tiny = Hyperparameters(trees=1, depth=2, seed=6, epsilon=0.05, delta=1e-2, init_share=0.0)
    f2 = GateFed(tmp_path, tiny).start()
    f2.fed.run()
    assert f2.session.exit_code == 0
    after = f2.machines["hosp-a"].receipt()["lifetime"]["train"]
    assert after["epsilon"] > before, f"a release at δ = 1e-2 lowered the lifetime ε from {before} to {after}"
    assert before == pytest.approx(dp_epsilon(random_events_dp(f.plan, 2), LIFETIME_DELTA), rel=0.02)
    assert after["delta"] == LIFETIME_DELTA
    oracle = dp_epsilon(random_events_dp(f.plan, 2) + random_events_dp(f2.plan, 1), LIFETIME_DELTA)
    assert after["epsilon"] == pytest.approx(oracle, rel=0.02) and after["epsilon"] >= oracle * (1 - 1e-9)
    # a central run with no RDP curve (greedy trees: stated as (ε, δ)) at δ = 1e-2 > --lifetime-delta: refused
    schema = tmp_path / "abalone-ids.toml"
    schema.write_text((EXAMPLES / "abalone" / "schema.toml").read_text()
                      .replace('columns = ["Sex"', 'id_column = "rid"\ncolumns = ["rid", "Sex"')
                      .replace("header = false", "header = true"))
    state = tmp_path / "state-hosp-a"
    rc, out, err = cli("train", "--data", f.paths["hosp-a"], "--schema", schema, "--out", tmp_path / "g.json",
                       "--tree-builder", "greedy", "--trees", "1", "--depth", "2", "--epsilon", "0.05", "--delta",
                       "1e-2", "--quiet", "--ledger", state)
    assert rc == 2 and "--lifetime-delta" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "g.json").exists()
    # a central random-tree run at δ = 1e-2 has an RDP curve: accepted, and it raises the lifetime ε
    rc, out, err = cli("train", "--data", f.paths["hosp-a"], "--schema", schema, "--out", tmp_path / "r.json",
                       "--epsilon", "0.05", "--delta", "1e-2", *RUN, "--ledger", state)
    assert rc == 0, err
    life = ledger_json(state)["populations"][0]["lifetime"]
    assert life["epsilon"] > after["epsilon"]
    oracle = dp_epsilon(random_events_dp(f.plan, 2) + random_events_dp(f2.plan, 1) + run_events(tmp_path / "r.json"),
                        LIFETIME_DELTA)
    assert life["epsilon"] == pytest.approx(oracle, rel=0.02)


# --------------------------------------------------------------------------- populations and the cap


def test_a_declared_population_has_an_account_of_its_own(tmp_path):
    files = variants(tmp_path / "data")
    schema = tmp_path / "data" / "schema.toml"
    other = cohort(60, seed=9)
    other["pid"] += 500_000  # other people
    other.to_csv(tmp_path / "data" / "trial.csv", index=False)
    state = tmp_path / "state"
    rc, out, err = train(state, files["base"], schema, tmp_path / "a.json", 1.0)
    assert rc == 0, err
    rc, out, err = train(state, tmp_path / "data" / "trial.csv", schema, tmp_path / "b.json", 1.0, "--population",
                         "trial-2024")
    assert rc == 0, err
    assert out["lifetime"]["population"] == "trial-2024" and out["lifetime"]["delta"] == LIFETIME_DELTA
    one = dp_epsilon(run_events(tmp_path / "a.json"), LIFETIME_DELTA)
    d = ledger_json(state)
    accounts = {a["population"]: a for a in d["populations"]}
    assert set(accounts) == {"default", "trial-2024"} and accounts["trial-2024"]["declared"]
    for a in accounts.values():
        assert a["lifetime"]["epsilon"] == pytest.approx(one, rel=0.02) and len(a["sessions"]) == 1
    rc, text, _ = cli("ledger", "--state", state)
    assert "population trial-2024 (declared with --population)" in text
    # the declared account's cap sees its own run only; the default account is untouched by it
    two = dp_epsilon(run_events(tmp_path / "a.json") * 2, LIFETIME_DELTA)
    rc, out, err = train(state, files["reordered"], schema, tmp_path / "c.json", 1.0, "--lifetime-epsilon",
                         f"{(one + two) / 2:.6f}")
    assert rc == 2 and "population default" in err
    rc, out, err = train(state, tmp_path / "data" / "trial.csv", schema, tmp_path / "c.json", 1.0,
                         "--lifetime-epsilon", f"{(one + two) / 2:.6f}", "--population", "trial-2024")
    assert rc == 2 and "population trial-2024" in err
    # a name that is no name: one line, exit 2, nothing written
    rc, out, err = train(state, files["base"], schema, tmp_path / "d.json", 1.0, "--population", "a b")
    assert rc == 2 and err.strip() == ("fedsbdt train: error: --population 'a b': a population's name is 1 to 64 "
                                       "letters, digits, '.', '_' or '-', starting with a letter or digit")
    assert len(ledger_json(state)["populations"][0]["sessions"]) == 1


def test_the_lifetime_cap_refuses_a_join_and_a_tune_on_the_same_records(tmp_path):
    """A central run on the site's file with its rows reordered and CRLF line ends, then a federated plan on
    the original file: the site refuses to join once the one account would pass --lifetime-epsilon (before:
    the reordered file was another dataset, at ε 0).  ``tune --ledger`` is refused the same way."""
    hp = Hyperparameters(trees=2, depth=2, seed=5, epsilon=1.0, init_share=0.0)
    probe = GateFed(tmp_path / "probe", hp)  # the plan's own ε at the lifetime δ, for the caps below
    alone = dp_epsilon(random_events_dp(probe.plan, 2), LIFETIME_DELTA)
    data = tmp_path / "data"
    data.mkdir()
    schema_file = tmp_path / "abalone-ids.toml"
    schema_file.write_text((EXAMPLES / "abalone" / "schema.toml").read_text()
                           .replace('columns = ["Sex"', 'id_column = "rid"\ncolumns = ["rid", "Sex"')
                           .replace("header = false", "header = true"))
    site_rows = pd.read_csv(probe.paths["hosp-a"])
    site_rows.sample(frac=1.0, random_state=2).to_csv(data / "a-reordered.csv", index=False, lineterminator="\r\n")
    state = tmp_path / "state-hosp-a"
    rc, out, err = cli("train", "--data", data / "a-reordered.csv", "--schema", schema_file, "--out",
                       tmp_path / "c.json", "--epsilon", "1", *RUN, "--ledger", state)
    assert rc == 0, err
    both = dp_epsilon(random_events_dp(probe.plan, 2) + run_events(tmp_path / "c.json"), LIFETIME_DELTA)
    cap = (alone + both) / 2
    with pytest.raises(SiteRefusal, match=r"joining would bring the lifetime ε of this site's records \(population "
                                          r"default\) to [0-9.]+ at --lifetime-delta 1e-06 \(now [0-9.]+.*above "
                                          rf"--lifetime-epsilon {cap:g}; refusing to take part") as refused:
        GateFed(tmp_path, hp, policy=SitePolicy(allow_central_noise=True, lifetime_epsilon=cap))
    now = float(re.search(r"\(now ([0-9.]+)", str(refused.value)).group(1))
    assert now == pytest.approx(dp_epsilon(run_events(tmp_path / "c.json"), LIFETIME_DELTA), rel=0.02)
    assert len(ledger_json(state)["populations"][0]["sessions"]) == 1  # nothing charged
    # with a larger cap it joins, and the account composes both (dp-accounting)
    f = GateFed(tmp_path, hp, policy=SitePolicy(allow_central_noise=True, lifetime_epsilon=both * 1.1)).start()
    f.fed.run()
    assert f.session.exit_code == 0
    life = f.machines["hosp-a"].receipt()["lifetime"]["train"]
    assert life["epsilon"] == pytest.approx(both, rel=0.02) and life["population"] == "default"
    # tune charges the same account: with the cap where it stands, tuning is refused before anything runs
    rc, out, err = cli("tune", "--data", f.paths["hosp-a"], "--schema", schema_file, "--out", tmp_path / "t.json",
                       "--epsilon", "1", "--rows", "80", "--quiet", "--ledger", state, "--lifetime-epsilon",
                       f"{life['epsilon'] * 1.01:.6f}")
    assert rc == 2 and "--lifetime-epsilon" in err and "nothing was trained" in err, err
    rc, out, err = cli("tune", "--data", f.paths["hosp-a"], "--schema", schema_file, "--out", tmp_path / "t.json",
                       "--epsilon", "1", "--rows", "80", "--quiet", "--json", "--ledger", state)
    assert rc == 0, err
    d = ledger_json(state)
    (acct,) = d["populations"]
    kinds = [s["kind"] for s in acct["sessions"]]
    assert kinds == ["central train run", "federated plan", "central tune run"]
    plan = acct["sessions"][1]
    assert plan["plan_sha256"] == f.plan.sha256 and plan["releases"] == 2 and plan["purposes"] == {"tree": 2}
    assert acct["lifetime"]["epsilon"] > life["epsilon"] + 0.9 * json.loads(out)["epsilon"]  # (ε, δ): adds
    long = ledger_json(state, "--releases")["populations"][0]["releases"]
    assert [r["purpose"] for r in long] == ["train", "tree", "tree", "tune"]
    rc, text, _ = cli("ledger", "--state", state)
    assert text.count(f"plan {f.plan.sha256[:16]}") == 1  # one line per session, not per tree


def test_site_policy_flags_are_checked_before_anything(tmp_path):
    rc, out, err = cli("client", "--coordinator", "localhost:1", "--site", "a", "--plan-hash", "0" * 64,
                       "--state", tmp_path / "s", "--lifetime-delta", "2")
    assert rc == 2 and err.strip() == "fedsbdt client: error: --lifetime-delta must be in (0, 1) (got 2.0)"
    rc, out, err = cli("client", "--coordinator", "localhost:1", "--site", "a", "--plan-hash", "0" * 64,
                       "--state", tmp_path / "s", "--population", "")
    assert rc == 2 and "--population ''" in err
    assert not (tmp_path / "s" / "lifetime.sqlite").exists()


# --------------------------------------------------------------------------- a ledger of the old schema


def test_a_ledger_written_by_the_first_schema_is_upgraded_in_place(tmp_path):
    """tests/data/lifetime-v1/lifetime.sqlite was written by 6a345f0 (make_fixture.py): a plan's two tree
    releases (the second read 30 of 40 records) and a central run (ε, δ) on cohort.csv.  Opened now, its
    schema is upgraded in place and every row is kept; its records (ids not stored then) are an unkeyed set:
    its worst position counts for every record; read again through the same bytes, the set takes the ids and
    composes by record."""
    state = tmp_path / "state"
    shutil.copytree(FIXTURE, state)
    old = sqlite3.connect(state / "lifetime.sqlite")
    cols = "id, dataset, at, plan_sha256, purpose, tree, level, round_id, records, mask, event, epsilon, delta"
    rows = old.execute(f"SELECT {cols} FROM releases ORDER BY id").fetchall()
    sets = old.execute("SELECT * FROM datasets").fetchall()
    old.close()
    d = ledger_json(state, "--releases")
    db = sqlite3.connect(state / "lifetime.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert db.execute(f"SELECT {cols} FROM releases ORDER BY id").fetchall() == rows  # nothing lost
    assert db.execute("SELECT key, source, content_sha256, ids_sha256, records, first_seen FROM datasets"
                      ).fetchall() == sets
    (acct,) = d["populations"]
    assert acct["population"] == "default" and [r["purpose"] for r in acct["releases"]] == ["tree", "tree", "train"]
    assert [s["kind"] for s in acct["sessions"]] == ["federated plan", "central train run"]
    assert acct["sources"][0]["legacy"] and not acct["sources"][0]["keyed"]
    tree = dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.5))
    approx = json.loads(rows[2][10])
    oracle = dp_epsilon([tree, tree], LIFETIME_DELTA - approx["delta"]) + approx["epsilon"]
    assert acct["lifetime"]["epsilon"] == pytest.approx(oracle, rel=0.02)
    assert ledger_json(state) == ledger_json(state)  # opening again changes nothing
    # the same bytes read again with their ids: the old set takes them, and a reordered copy composes by id
    rc, out, err = train(state, state / "cohort.csv", state / "schema.toml", tmp_path / "m.json", 0.5)
    assert rc == 0, err
    frame = pd.read_csv(state / "cohort.csv")
    frame.iloc[::-1].to_csv(tmp_path / "reversed.csv", index=False)
    rc, out, err = train(state, tmp_path / "reversed.csv", state / "schema.toml", tmp_path / "n.json", 0.5)
    assert rc == 0, err
    (acct,) = ledger_json(state)["populations"]
    assert acct["sources"][0]["keyed"] and acct["sources"][0]["legacy"] and len(acct["sources"]) == 2
    assert acct["lifetime"]["records"] == 40
    runs = run_events(tmp_path / "m.json") + run_events(tmp_path / "n.json")
    worst = dp_epsilon([tree, tree] + runs, LIFETIME_DELTA - approx["delta"]) + approx["epsilon"]
    assert acct["lifetime"]["epsilon"] == pytest.approx(worst, rel=0.02)
    # a database of a later schema is refused, not rewritten
    db.execute("PRAGMA user_version = 3")
    db.commit()
    rc, out, err = cli("ledger", "--state", state)
    assert rc == 2 and "newer fedsbdt" in err


# --------------------------------------------------------------------------- the composition itself


def test_records_compose_by_id_and_an_unkeyed_sets_worst_row_counts_for_every_record(tmp_path):
    """By id across record sets (whatever their load order), and an unkeyed set's worst row for every record:
    the account's ε is its worst record's, as dp-accounting composes that record's releases."""
    from fedsbdt.common.lifetime import LifetimeLedger, RecordSource

    def g(z):
        return {"type": "gaussian", "noise_multiplier": z}

    lt = LifetimeLedger(tmp_path)
    a = lt.record_set("default", RecordSource("a.csv", "aa" * 32, np.arange(10), keyed=True))
    b = lt.record_set("default", RecordSource("b.csv", "bb" * 32, np.arange(5, 15)[::-1].copy(), keyed=True))
    c = lt.record_set("default", RecordSource("c.csv", "cc" * 32, np.arange(8), keyed=False))  # row numbers
    lt.charge(a, "tree", g(2.0), 1e-6, np.arange(10) < 5, "p" * 64)  # ids 0..4
    lt.charge(b, "tree", g(3.0), 1e-6, None, "q" * 64)  # ids 5..14
    lt.charge(b, "tree", g(3.0), 1e-6, np.arange(10) >= 5, "q" * 64)  # b's rows 5..9: ids 9..5
    lt.charge(c, "tree", g(4.0), 1e-6, np.arange(8) < 2, "r" * 64)  # rows 0, 1
    lt.charge(c, "tree", g(5.0), 1e-6, np.arange(8) >= 2, "r" * 64)  # rows 2..7: the worst row is the first two
    life = lt.lifetime()
    G = dp_accounting.GaussianDpEvent
    # ids 0..4: σ 2 (RDP α/8) and c's worst row (σ 4); ids 5..9: σ 3 twice (α/9) and σ 4; ids 10..14: σ 3, σ 4
    assert life.epsilon == pytest.approx(dp_epsilon([G(2.0), G(4.0)], LIFETIME_DELTA), rel=1e-3)
    assert (life.records, life.worst, life.delta) == (15, 5, LIFETIME_DELTA)
    # a session alone, and a release to come on every record of a source (what admission adds)
    assert lt.lifetime(session="q" * 64).epsilon == pytest.approx(dp_epsilon([G(3.0), G(3.0)], LIFETIME_DELTA),
                                                                   rel=1e-3)
    more = RecordSource("d.csv", "dd" * 32, np.array([12, 13, 99]), keyed=True)
    after = lt.lifetime(extra=[(more, g(1.0))])
    oracle = dp_epsilon([G(3.0), G(4.0), G(1.0)], LIFETIME_DELTA)  # ids 12, 13 (99: σ 1 and σ 4 only)
    assert after.epsilon == pytest.approx(oracle, rel=0.01) and after.epsilon >= oracle  # integer orders: ≥
    assert after.records == 16 and lt.lifetime().records == 15  # nothing written
    # the gate's per-plan counts follow the ids into another set of the same records
    again = lt.record_set("default", RecordSource("b2.csv", "ee" * 32, np.arange(5, 15), keyed=True))
    np.testing.assert_array_equal(lt.plan_counts(again, "q" * 64, ["tree"])[:, 0], [2] * 5 + [1] * 5)
    lt.close()
