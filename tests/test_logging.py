"""Structured logging: --log-format/--log-level, progress records, and the --json stdout contract."""
import io
import json
import logging

import numpy as np
import pytest

from fedsbdt.cli import main
from fedsbdt.common.logging_setup import configure_logging

from conftest import ABALONE, EXAMPLES

TRAIN = ["train", "--data", str(ABALONE), "--schema", str(EXAMPLES / "abalone/schema.toml"),
         "--trees", "30", "--depth", "2"]


def test_json_logs_and_json_stdout(tmp_path, capsys):
    assert main(["--log-format", "json", *TRAIN, "--out", str(tmp_path / "m.json"), "--json"]) == 0
    cap = capsys.readouterr()
    result = json.loads(cap.out)  # stdout: exactly one JSON object, nothing else
    assert cap.out.count("\n") == 1 and result["trees"] == 30
    records = [json.loads(line) for line in cap.err.splitlines()]  # stderr: only JSON lines
    progress = [r for r in records if r["logger"] == "fedsbdt.train"]
    assert [r["round"] for r in progress] == [3, 6, 9, 12, 15, 18, 21, 24, 27, 30]  # every 10 %
    for r in progress:
        assert {"ts", "level", "logger", "msg", "round", "total", "epsilon", "elapsed", "eta"} <= set(r)
        assert r["level"] == "INFO" and r["total"] == 30 and r["ts"].endswith("Z")
        assert r["epsilon"] == pytest.approx(result["epsilon"]) and r["eta"] >= 0
    assert progress[-1]["eta"] == 0.0


def test_text_logs_keep_the_plain_progress_line(tmp_path, capsys):
    assert main([*TRAIN, "--out", str(tmp_path / "m.json")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 10 and "INFO fedsbdt.train: train: round 30/30 ε=" in err[-1] and "eta 0.0s" in err[-1]


def test_json_flag_alone_stays_quiet_and_level_filters(tmp_path, capsys):
    assert main([*TRAIN, "--out", str(tmp_path / "m.json"), "--json"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["--log-format", "json", "--log-level", "warning", *TRAIN, "--out", str(tmp_path / "m.json")]) == 0
    assert capsys.readouterr().err == ""


def test_errors_are_one_json_line(capsys):
    assert main(["--log-format", "json", "evaluate", "--model", "/nonexistent.json", "--data", "x"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    (line,) = cap.err.splitlines()
    rec = json.loads(line)
    assert rec["level"] == "ERROR" and "model file not found" in rec["msg"] and rec["exit"] == 2


def test_formatter_extra_fields_and_idempotent_configuration():
    buf = io.StringIO()
    configure_logging("json", "debug", stream=buf)
    log = configure_logging("json", "debug", stream=buf)  # reconfiguring replaces, never duplicates
    logging.getLogger("fedsbdt.x").debug("hello %s", "you", extra={"n": np.int64(3), "arr": (np.float32(0.5),)})
    (line,) = buf.getvalue().splitlines()
    rec = json.loads(line)
    assert rec["msg"] == "hello you" and rec["n"] == 3 and rec["arr"] == [0.5] and rec["logger"] == "fedsbdt.x"
    # exactly one handler of ours (pytest >= 9.2 also attaches its capture handlers to non-propagating loggers)
    assert [type(h) for h in log.handlers if not type(h).__module__.startswith("_pytest")] == [logging.StreamHandler]
    assert not log.propagate
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml")
    configure_logging("text", "info")


def test_handler_follows_a_replaced_stderr(monkeypatch):
    configure_logging("text", "info")
    for _ in range(2):
        buf = io.StringIO()
        monkeypatch.setattr("sys.stderr", buf)
        logging.getLogger("fedsbdt.y").info("to the current stderr")
        assert buf.getvalue().endswith("INFO fedsbdt.y: to the current stderr\n")


def test_progress_without_logging_configured_prints_plain_lines(capsys):
    from fedsbdt.common.cli import Progress

    logger = logging.getLogger("fedsbdt")  # no handler on the way up: none of ours, and pytest's own on the
    for h in list(logger.handlers):  # root logger out of reach (tests/conftest.py puts the logger back)
        logger.removeHandler(h)
    logger.propagate = False
    p = Progress("job", 4)
    for i in range(1, 5):
        p(i, 4)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and err[-1].startswith("job: round 4/4")


def test_grpc_core_logging_is_off_unless_the_user_asked_for_it():
    from fedsbdt.common.logging_setup import quiet_grpc_core

    env: dict[str, str] = {}
    quiet_grpc_core(env)
    assert env == {"GRPC_VERBOSITY": "NONE", "GRPC_TRACE": ""}
    env = {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "tcp"}
    quiet_grpc_core(env)
    assert env == {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "tcp"}


def test_a_grpc_bind_failure_is_our_one_line_not_c_core_lines(tmp_path):
    """Without GRPC_VERBOSITY the C core prints ``E… add_port.cc:…`` lines on a failed bind; the coordinator
    prints its own line only.  (An address that cannot be bound and that no process listens on.)"""
    import os
    import subprocess
    import sys

    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.federation.plan import SiteEntry, make_plan
    from fedsbdt.common.schema import Schema

    from conftest import EXAMPLES, ROOT

    schema = Schema.load(EXAMPLES / "abalone" / "schema.toml")
    plan = make_plan(schema, Hyperparameters(trees=2, depth=2, seed=1),
                     [SiteEntry(f"s{i}", bytes([i]) * 32) for i in range(3)], max_records_per_site=100)
    plan.save(tmp_path / "plan.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "coordinator", "--plan", str(tmp_path / "plan.toml"),
                        "--insecure", "--listen", "192.0.2.1:7443", "--state", str(tmp_path / "state")],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsbdt coordinator: error: cannot listen on 192.0.2.1:7443"), lines
