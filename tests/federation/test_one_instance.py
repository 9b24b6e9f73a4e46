"""Run it like a service: one instance per state directory and address, SIGTERM as SIGINT (real processes).

docs/deployment.md "One instance" and "Stopping": a second coordinator or site on the same ``--state`` (or a
second coordinator on the same address) exits 2 with one line naming the directory or address and the
process that holds it; SIGTERM stops a coordinator or a site cleanly with exit 130 and one line saying how to
resume, and the restarted process resumes from its state.
"""
from __future__ import annotations

import os
import signal

from fedsbdt.common.config import Hyperparameters

from .conftest import SITES, abalone_with_ids, make_identities, make_test_plan, write_splits


def _files(tmp_path):
    schema, raw = abalone_with_ids(90)
    ids = make_identities(tmp_path, SITES)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=3, epsilon=1.0))
    plan.save(tmp_path / "plan.toml")
    return write_splits(raw, SITES, tmp_path / "data")


def _listening(c, after: int = 0):
    ev = c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") in ("listening", "_exit"),
                      timeout=60, after=after)
    assert ev["event"] == "listening", c.diagnosis()


def _one_line(proc) -> str:
    text = "".join(proc.lines)
    assert "Traceback" not in text, text
    return proc.errors


def test_a_second_coordinator_on_the_same_state_or_address_exits_2_naming_the_holder(tmp_path, cluster_factory):
    _files(tmp_path)
    c = cluster_factory(tmp_path / "plan.toml")
    first = c.coordinator(tls=False)
    _listening(c)
    holder = f"pid {first.p.pid}"
    # the same --state on another port
    same_state = c.coordinator("--listen", "127.0.0.1:0", tls=False)  # a later --listen wins in argparse
    assert same_state.wait(timeout=60) == 2
    msg = _one_line(same_state)
    assert str(tmp_path / "coordinator") in msg and holder in msg and "in use" in msg, msg
    # the same address with another --state (gRPC would otherwise bind it too, with SO_REUSEPORT)
    same_port = c.coordinator("--state", str(tmp_path / "other-state"), tls=False)
    assert same_port.wait(timeout=60) == 2
    msg = _one_line(same_port)
    assert f"127.0.0.1:{c.port}" in msg and holder in msg and "in use" in msg, msg
    assert not (tmp_path / "other-state" / "coordinator.sqlite").exists()
    assert first.alive
    # SIGTERM stops the first one cleanly: exit 130, how to resume, and the lock goes with it
    first.p.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 130
    assert "restart with the same command to resume" in _one_line(first)
    mark = c.mark()
    again = c.coordinator(tls=False)
    _listening(c, after=mark)
    again.p.send_signal(signal.SIGTERM)
    assert again.wait(timeout=60) == 130


def test_a_second_site_on_the_same_state_exits_2_and_sigterm_stops_a_site_for_a_resume(tmp_path, cluster_factory):
    data = _files(tmp_path)
    c = cluster_factory(tmp_path / "plan.toml")
    c.coordinator(tls=False)
    site = c.site("hospital-1", data["hospital-1"], tls=False)
    c.wait_event(lambda e: e.get("_proc") == "hospital-1" and e.get("event") == "joined", timeout=90)
    twin = c.site("hospital-1", data["hospital-1"], tls=False)
    assert twin.wait(timeout=60) == 2
    msg = _one_line(twin)
    assert str(tmp_path / "hospital-1") in msg and f"pid {site.p.pid}" in msg, msg
    assert (tmp_path / "hospital-1" / "fedsbdt.lock").read_text().split()[0] == str(site.p.pid)
    os.kill(site.p.pid, signal.SIGTERM)
    assert site.wait(timeout=60) == 130  # not 143: SIGTERM is handled as SIGINT
    msg = _one_line(site)
    assert "interrupted" in msg and "restart the same command to resume" in msg, msg
    # the lock went with the process: the same command starts again and re-joins with its ledger and keys
    mark = c.mark()
    again = c.site("hospital-1", data["hospital-1"], tls=False)
    c.wait_event(lambda e: e.get("_proc") == "hospital-1" and e.get("event") == "joined", timeout=90, after=mark)
    again.p.send_signal(signal.SIGTERM)
    assert again.wait(timeout=60) == 130


def test_a_new_plan_on_an_old_state_names_the_tls_files_and_tls_dir_brings_them(tmp_path, ca_dir, cluster_factory):
    from .conftest import tls_session_files

    schema, raw = abalone_with_ids(60)
    files = tls_session_files(tmp_path, ca_dir, schema, raw, Hyperparameters(trees=3, depth=2, seed=5))
    new_plan = make_test_plan(schema, files.ids, Hyperparameters(trees=3, depth=2, seed=6))
    new_plan.save(tmp_path / "new-plan.toml")
    c = cluster_factory(tmp_path / "plan.toml")
    old = c.coordinator()  # TLS files in tmp_path/coordinator, its --state
    _listening(c)
    old.p.send_signal(signal.SIGTERM)
    assert old.wait(timeout=60) == 130
    state = tmp_path / "coordinator"
    refused = c.coordinator("--plan", str(tmp_path / "new-plan.toml"))
    assert refused.wait(timeout=60) == 2
    msg = _one_line(refused)
    assert "belongs to plan" in msg and f"copy tls.crt, tls.key and ca.crt from {state}" in msg, msg
    assert f"--tls-dir {state}" in msg
    mark = c.mark()
    fresh = c.coordinator("--plan", str(tmp_path / "new-plan.toml"), "--state", str(tmp_path / "new-state"),
                          "--tls-dir", str(state))
    _listening(c, after=mark)
    fresh.p.send_signal(signal.SIGTERM)
    assert fresh.wait(timeout=60) == 130


def _run_until(cmd: list[str], marker: str, timeout: float = 120.0):
    """Start ``fedsbdt …`` (JSON logs) and return it once a stderr line contains ``marker`` (with a deadline)."""
    import subprocess
    import sys
    import threading

    from .conftest import ROOT

    p = subprocess.Popen([sys.executable, "-m", "fedsbdt.cli", "--log-format", "json", *cmd], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for ln in p.stderr:
            lines.append(ln)
            if marker in ln:
                seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(timeout) and p.poll() is None, "".join(lines[-20:])

    def stopped(wait: float) -> int:
        """Its exit status, once every stderr line it wrote has been read (the reader may lag the exit)."""
        code = p.wait(timeout=wait)
        reader.join(timeout=30)
        return code

    return p, lines, stopped


def test_sigterm_stops_train_cleanly_with_exit_130_and_nothing_written(tmp_path):
    from .conftest import ROOT

    model = tmp_path / "m.json"
    p, lines, stopped = _run_until(["train", "--data", str(ROOT / "examples/abalone/abalone.data"), "--schema",
                           str(ROOT / "examples/abalone/schema.toml"), "--out", str(model), "--trees", "100000",
                           "--depth", "2"], '"round": ')
    p.send_signal(signal.SIGTERM)
    assert stopped(60) == 130
    import json

    last = json.loads(lines[-1])
    assert last["event"] == "interrupted" and "run the same command again" in last["msg"], lines[-3:]
    assert not model.exists() and "Traceback" not in "".join(lines)


def test_sigterm_stops_the_demo_and_every_child_it_started(tmp_path):
    work = tmp_path / "demo"
    # progress is logged every 10 %: the first line comes after 100 of the 1000 trees, far from the end
    p, lines, stopped = _run_until(["demo", "--sites", "2", "--trees", "1000", "--depth", "2", "--workdir", str(work)],
                          '"round": ', timeout=240)
    p.send_signal(signal.SIGTERM)
    assert stopped(90) == 130, "".join(lines[-10:])
    assert "a demo does not resume" in lines[-1]
    children = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and str(work).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                children.append(pid)
        except OSError:
            pass
    assert children == []
    assert "interrupted" in (work / "logs" / "hospital-1.log").read_text()  # each site stopped cleanly too
