"""Bad site data and bad plans, through the command line: every one a clear, single-line refusal.

Site data goes through ``fedsbdt client`` against a coordinator serving the
plan (in this process, plain gRPC: identity is not what these tests are
about): the client fetches the plan, checks its data against the plan's
schema and refuses — exit 2, one line naming the file, the line or row and the
column — and never joins.  Plans go through ``fedsbdt coordinator`` (refused
before anything is created) and through a site, served by a fake coordinator
that serves whatever bytes it is given.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent import futures

import grpc
import numpy as np
import pandas as pd
import pytest

from fedsbdt.cli import main
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.schema import Schema
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.server.service import CoordinatorServer
from fedsbdt.server.session import Session
from fedsbdt.common.federation.toml_writer import dumps
from fedsbdt.common.federation.wire import SERVER_OPTIONS

from federation.conftest import abalone_with_ids, make_identities, make_test_plan

from .harness import ROOT

SITES = ["hospital-1", "hospital-2"]

TINY = {"name": "tiny", "task": "binary", "target": "y", "id_column": "id", "columns": ["id", "x", "c", "y"],
        "positive": ["yes"], "negative": ["no"], "format": {"header": True, "separator": ",", "out_of_range": "error"},
        "features": [{"name": "x", "type": "numeric", "range": [0.0, 1.0]},
                     {"name": "c", "type": "categorical", "levels": ["a", "b"]}]}


class Served:
    def __init__(self, root, schema, hp=None) -> None:
        self.ids = make_identities(root, SITES)
        self.plan = make_test_plan(schema, self.ids, hp or Hyperparameters(trees=3, depth=2, seed=1),
                                   randomness="insecure-test")
        self.session = Session(self.plan, self.plan.make_randomness(True), time.monotonic())
        self.server = CoordinatorServer(self.session, "127.0.0.1:0")
        self.server.start()
        self.root = root
        self.pin = ["--plan-hash", self.plan.sha256, "--min-sites", "2"]  # the plan and a policy it meets

    def client(self, data, capsys, *extra: str) -> tuple[int, str]:
        rc = main(["client", "--coordinator", self.server.address, "--site", "hospital-1", "--data", str(data),
                   "--state", str(self.root / "hospital-1"), "--insecure", "--allow-insecure-test-randomness",
                   "--reconnect-timeout", "10", *self.pin, *extra])
        return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    schema, raw = abalone_with_ids(40)
    d = schema.to_dict()
    d["format"]["out_of_range"] = "error"  # values outside the public ranges are refused, not clipped
    s = Served(tmp_path_factory.mktemp("reg"), Schema.from_dict(d))
    try:
        yield s, raw.astype(object)
    finally:
        s.server.stop(grace=0.5)


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("bin"), Schema.from_dict(TINY))
    rows = pd.DataFrame({"id": np.arange(1, 21), "x": np.linspace(0, 1, 20), "c": ["a", "b"] * 10,
                         "y": ["yes", "no", "no", "yes"] * 5}).astype(object)
    try:
        yield s, rows
    finally:
        s.server.stop(grace=0.5)


def edit(frame: pd.DataFrame, col: str, i: int, value) -> pd.DataFrame:
    f = frame.copy()
    f.loc[i, col] = value
    return f


def csv_text(frame: pd.DataFrame) -> str:
    return frame.to_csv(index=False)


# (name, builder(raw) -> file content (str = CSV text, DataFrame = Parquet, bytes = raw bytes), expected pieces)
REGRESSION_CASES = [
    ("type.csv", lambda r: csv_text(edit(r, "Length", 3, "abc")), ["line 5", "column 'Length'", "'abc' is not a number"]),
    ("nan.csv", lambda r: csv_text(edit(r, "Height", 2, "nan")), ["line 4", "column 'Height'", "NaN/inf"]),
    ("inf.csv", lambda r: csv_text(edit(r, "Diameter", 9, "-inf")), ["line 11", "column 'Diameter'", "NaN/inf"]),
    ("range.csv", lambda r: csv_text(edit(r, "Length", 4, 7.5)),
     ["line 6", "column 'Length'", "7.5 is outside the public range [0.1, 0.8]"]),
    ("category.csv", lambda r: csv_text(edit(r, "Sex", 5, "X")),
     ["line 7", "column 'Sex'", "unknown category 'X' (public levels: M, F, I)"]),
    ("duplicate.csv", lambda r: csv_text(edit(r, "rid", 6, r.loc[1, "rid"])),
     ["duplicate record ids", "lines 3 and 8 share id '18'"]),
    ("label_range.csv", lambda r: csv_text(edit(r, "Rings", 7, 99)),
     ["line 9", "label 'Rings'", "99 is outside the public label range [1, 29]"]),
    ("label_text.csv", lambda r: csv_text(edit(r, "Rings", 7, "many")), ["line 9", "label 'Rings'", "not a finite number"]),
    ("empty.csv", lambda r: "", ["the file holds no data rows"]),
    ("header_only.csv", lambda r: ",".join(r.columns) + "\n", ["the file holds no data rows"]),
    ("too_many_fields.csv", lambda r: csv_text(r).replace("\n", ",1,2\n", 4).replace(",1,2\n", "\n", 3),
     ["line 4: expected 10 fields as in the header, found 12"]),
    ("missing_column.csv", lambda r: csv_text(r.drop(columns=["Length"])), ["missing column(s) 'Length'"]),
    ("binary.csv", lambda r: os.urandom(64) + b"\xff", ["not UTF-8 text"]),
    ("garbage.parquet", lambda r: b"PAR1" + os.urandom(100), ["not a readable Parquet file"]),
    ("type.parquet", lambda r: edit(r, "Length", 3, "abc").astype(str), ["row 4", "column 'Length'", "'abc' is not a number"]),
    ("null_id.parquet", lambda r: r.astype({"rid": "Int64"}).pipe(lambda f: f.assign(
        rid=pd.array([None] + list(f["rid"][1:]), dtype="Int64"))), ["row 1", "id column 'rid'", "missing record id"]),
    ("null_category.parquet", lambda r: r.assign(Sex=pd.array(list(r["Sex"][:-1]) + [None], dtype="string"))
     .astype({c: float for c in r.columns if c not in ("Sex",)}), ["row 40", "column 'Sex'", "missing value"]),
]

BINARY_CASES = [
    ("label.csv", lambda r: csv_text(edit(r, "y", 3, "maybe")),
     ["line 5", "label 'y'", "'maybe' is not a class label of this binary task (allowed: 'yes', 'no')"]),
    ("label_numeric.parquet", lambda r: r.assign(y=[1.0] * len(r)).astype({"x": float, "id": int}),
     ["row 1", "label 'y'", "'1' is not a class label"]),
    ("category.csv", lambda r: csv_text(edit(r, "c", 0, "z")), ["line 2", "column 'c'", "unknown category 'z'"]),
]


def write(path, content) -> None:
    if isinstance(content, pd.DataFrame):
        content.to_parquet(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def check_refused(served, rc: int, err: str, path, expected) -> None:
    assert rc == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("fedsbdt client: error: the local data does not match the plan's schema: "), err
    assert str(path) in lines[-1] and all(e in lines[-1] for e in expected), (expected, lines[-1])
    assert "Traceback" not in err
    assert served.session.sites["hospital-1"].joins == 0  # it never joined: nothing left the site


@pytest.mark.parametrize("name,build,expected", REGRESSION_CASES, ids=[c[0] for c in REGRESSION_CASES])
def test_bad_site_data_is_refused_by_the_client_naming_file_row_and_column(regression, tmp_path, capsys, name,
                                                                            build, expected):
    served, raw = regression
    path = tmp_path / name
    write(path, build(raw))
    rc, err = served.client(path, capsys)
    check_refused(served, rc, err, path, expected)


@pytest.mark.parametrize("name,build,expected", BINARY_CASES, ids=[c[0] for c in BINARY_CASES])
def test_bad_labels_and_categories_of_a_binary_task_are_refused(binary, tmp_path, capsys, name, build, expected):
    served, rows = binary
    path = tmp_path / name
    write(path, build(rows))
    rc, err = served.client(path, capsys)
    check_refused(served, rc, err, path, expected)


def test_the_good_files_are_accepted(regression, binary, tmp_path, capsys):
    """The fixtures' baseline data passes the same checks (so the refusals above are about the edits)."""
    from fedsbdt.common.data import load

    for served, frame, name in ((regression[0], regression[1], "ok.csv"), (binary[0], binary[1], "ok.parquet")):
        path = tmp_path / name
        write(path, csv_text(frame) if name.endswith(".csv") else frame.astype({"x": float, "id": int}))
        assert load(path, served.plan.schema).n == len(frame)


def test_a_real_client_process_refuses_bad_data_with_one_line_and_exit_2(regression, tmp_path):
    served, raw = regression
    path = tmp_path / "bad.csv"
    write(path, csv_text(edit(raw, "Length", 3, "abc")))
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "client", "--coordinator", served.server.address,
                        "--site", "hospital-1", "--data", str(path), "--state", str(served.root / "hospital-1"),
                        "--insecure", "--allow-insecure-test-randomness", *served.pin], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines()[-1] == (
        f"fedsbdt client: error: the local data does not match the plan's schema: {path}: line 5, "
        "column 'Length': 'abc' is not a number")


# --------------------------------------------------------------------------- plans


NAN_MARK = 123456.789


def plan_variants(plan):
    """Bad plans as (name, TOML text, expected message piece)."""
    base = plan.to_dict()

    def with_(path, value):
        d = json.loads(json.dumps(base))
        node = d
        for k in path[:-1]:
            node = node[k]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return d

    def hp_(**changes):
        return {**json.loads(json.dumps(base)), "hyperparameters": {**base["hyperparameters"], **changes}}

    cases = [
        ("missing [hyperparameters]", with_(("hyperparameters",), KeyError), "missing [hyperparameters] section"),
        ("missing session.threshold", with_(("session", "threshold"), KeyError), "missing session.threshold"),
        ("missing seed", with_(("hyperparameters", "seed"), KeyError), "hyperparameters.seed is required"),
        ("missing [privacy]", with_(("privacy",), KeyError), "missing [privacy] section"),
        ("gamma 0", with_(("hyperparameters", "subsample"), 0.0), "γ must be in (0, 1]"),
        ("gamma 1.5", with_(("hyperparameters", "subsample"), 1.5), "γ must be in (0, 1]"),
        ("r1 0", with_(("hyperparameters", "r1"), 0.0), "the Hessian noise share must be in (0, 1)"),
        ("r1 1", with_(("hyperparameters", "r1"), 1.0), "the Hessian noise share must be in (0, 1)"),
        ("epsilon 0", with_(("hyperparameters", "epsilon"), 0.0), "epsilon = 0.0: must be > 0"),
        ("epsilon -1", with_(("hyperparameters", "epsilon"), -1.0), "epsilon = -1.0: must be > 0"),
        ("epsilon nan", with_(("hyperparameters", "epsilon"), NAN_MARK), "must be a finite number"),
        ("epsilon 1e308", with_(("hyperparameters", "epsilon"), 1e308), "too large for the accountant"),
        ("depth 13", with_(("hyperparameters", "depth"), 13), "depth = 13: must be in 1..12"),
        ("message limit", with_(("session", "epoch_rounds"), 10**6), "epoch_rounds"),
        ("initial score takes all", hp_(init_share=0.9, eps_ds=0.2), "leaving nothing for the trees"),
        ("sigma does not match", with_(("privacy", "sigma"), base["privacy"]["sigma"] / 2),
         "refusing a plan whose noise does not match its privacy claim"),
        ("epsilon does not match", with_(("privacy", "epsilon"), base["privacy"]["epsilon"] / 2),
         "refusing a plan whose noise does not match its privacy claim"),
        ("filter with pld", hp_(accountant="pld", filter=True), "needs the RDP accountant"),
        ("filter not a bool", with_(("hyperparameters", "filter"), 0.5), "filter = 0.5: must be true or false"),
        ("schema columns not a list", with_(("schema", "columns"), 7), "malformed"),
        ("label range of strings", with_(("schema", "label_range"), ["a", "b"]), "malformed"),
        ("threshold too low", with_(("session", "threshold"), 1), "secure aggregation needs 2t > n + colluders"),
    ]
    # TOML has nan, the plan writer refuses to emit it: put it in by hand
    return [(name, dumps(d).replace(repr(NAN_MARK), "nan"), msg) for name, d, msg in cases]


@pytest.fixture(scope="module")
def a_plan(tmp_path_factory):
    schema, _ = abalone_with_ids(20)
    root = tmp_path_factory.mktemp("plans")
    return make_test_plan(schema, make_identities(root, SITES), Hyperparameters(trees=5, depth=2, seed=3)), root


def test_the_coordinator_refuses_bad_plans_with_a_clear_message_and_creates_nothing(a_plan, tmp_path, capsys):
    plan, _ = a_plan
    for name, text, msg in plan_variants(plan):
        path = tmp_path / f"{name.replace(' ', '_')}.toml"
        path.write_text(text)
        state = tmp_path / f"state-{name.replace(' ', '_')}"
        rc = main(["coordinator", "--plan", str(path), "--listen", "127.0.0.1:0", "--state", str(state),
                   "--insecure"])
        err = capsys.readouterr().err
        assert rc == 2, (name, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("fedsbdt coordinator: error: ") and msg in last, (name, last)
        assert "Traceback" not in err and not state.exists(), name


class FakeCoordinator(pbg.FederationServicer):
    """Serves whatever plan bytes (and announced hash) it is given; refuses everything else."""

    def __init__(self) -> None:
        self.plan, self.sha = b"", ""
        self.joins = 0

    def GetPlan(self, request, context):
        return pb.GetPlanResponse(plan=self.plan, plan_sha256=self.sha)

    def Join(self, request, context):
        self.joins += 1
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "fake coordinator")


@pytest.fixture
def fake(tmp_path):
    svc = FakeCoordinator()
    srv = grpc.server(futures.ThreadPoolExecutor(4), options=list(SERVER_OPTIONS))
    pbg.add_FederationServicer_to_server(svc, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield svc, f"127.0.0.1:{port}"
    finally:
        srv.stop(0)


def test_sites_refuse_bad_plans_served_by_a_coordinator(a_plan, fake, tmp_path, capsys):
    from fedsbdt.common.federation.plan import Plan

    plan, root = a_plan
    svc, address = fake
    data = tmp_path / "data.csv"
    _, raw = abalone_with_ids(20)
    raw.iloc[::2].to_csv(data, index=False)
    served = []
    for name, text, msg in plan_variants(plan):
        try:  # what a coordinator would serve: the canonical JSON of the (bad) plan, or its raw dict
            served.append((name, Plan.from_toml(text).canonical_json, msg))
        except Exception:
            import tomllib

            served.append((name, json.dumps(tomllib.loads(text), sort_keys=True, separators=(",", ":"))
                           .encode(), msg))
    served += [
        ("not JSON", b"\xff{not json", "not valid JSON"),
        ("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        ("not canonical", plan.canonical_json.replace(b'{"', b'{ "', 1), "not in canonical form"),
        ("a list", b"[1, 2, 3]", "a plan is a table of sections"),
    ]
    for name, body, msg in served:
        svc.plan, svc.sha = body, hashlib.sha256(body).hexdigest()
        rc = main(["client", "--coordinator", address, "--site", "hospital-1", "--data", str(data),
                   "--state", str(root / "hospital-1"), "--insecure", "--reconnect-timeout", "5",
                   "--plan-hash", svc.sha])  # pinned: the coordinator serves what the site was told
        err = capsys.readouterr().err
        assert rc == 2, (name, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("fedsbdt client: error: ") and msg in last, (name, last)
        assert "Traceback" not in err, name
    # a hash that does not match the served bytes, and a plan other than the one given out of band
    svc.plan, svc.sha = plan.canonical_json, "0" * 64
    assert main(["client", "--coordinator", address, "--site", "hospital-1", "--data", str(data), "--state",
                 str(root / "hospital-1"), "--insecure", "--plan-hash", plan.sha256]) == 2
    assert "does not match the hash it announces" in capsys.readouterr().err
    svc.sha = plan.sha256
    assert main(["client", "--coordinator", address, "--site", "hospital-1", "--data", str(data), "--state",
                 str(root / "hospital-1"), "--insecure", "--plan-hash", "ab" * 32]) == 2
    assert "plan hash mismatch" in capsys.readouterr().err
    assert svc.joins == 0
