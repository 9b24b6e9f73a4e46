"""Real-process federations under faults: start, kill (at test-hook points or at random), restart, check.

Shared by the hardening tests and ``benchmarks/soak.py``.  Every process is a
``python -m fedsbdt.cli --log-format json …`` child; a reader thread per
process turns its stderr lines into events (and its exit into an ``_exit``
event), so callers wait for *events* with a deadline instead of sleeping.

Kill points are the test-only hook of :mod:`fedsbdt.common.testhooks`
(``FEDSBDT_TEST_KILL_AT``): a process SIGKILLs itself at a named protocol
stage and prints one ``fedsbdt-testhook:`` line first, which lets the
orchestrator check that the kill happened where it was asked for.

:func:`check_outcome` verifies everything the hardening brief asks of a run
that survived faults, from the files the parties left behind (model files,
the coordinator's SQLite checkpoint, every site's SQLite ledger) and from
the coordinator's debug log (which masked inputs it received).
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from federation.processes import ROOT, EventLog, Proc, free_port, pin_plan  # noqa: F401  (ROOT: for the tests)


@dataclass
class Federation(EventLog):
    """A coordinator and its sites as processes; parties keep their name across restarts."""

    root: Path
    plan_path: Path
    port: int = field(default_factory=free_port)
    listen_host: str = "127.0.0.1"
    connect_host: str = "localhost"
    events: list[dict] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    current: dict[str, Proc] = field(default_factory=dict)
    history: list[Proc] = field(default_factory=list)
    site_args: dict[str, dict] = field(default_factory=dict)

    # ------------------------------------------------------------------ events

    def diagnosis(self, n: int = 25) -> str:
        """Recent events plus a stack dump of every live process (faulthandler on SIGUSR1)."""
        alive = [p for p in self.current.values() if p.alive]
        for p in alive:
            try:
                os.kill(p.p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.5) if alive else None  # let the dumps reach the reader threads
        dumps = []
        for p in alive:
            tail = [ln.rstrip() for ln in p.lines if not ln.startswith("{")][-60:]
            if tail:
                dumps.append(f"--- {p.name}#{p.incarnation} (pid {p.p.pid}) ---\n" + "\n".join(tail))
        return super().diagnosis(n) + ("\n" + "\n".join(dumps) if dumps else "")

    # ------------------------------------------------------------------ parties

    @property
    def address(self) -> str:
        return f"{self.connect_host}:{self.port}"

    def _start(self, name: str, argv: list[str], kill_at: str | None, prefix=(), log_level="info") -> Proc:
        inc = sum(1 for p in self.history if p.name == name)
        env = {"FEDSBDT_TEST_KILL_AT": kill_at} if kill_at else {}
        p = Proc(self, name, argv, env, tuple(prefix), log_level, inc)
        self.current[name] = p
        self.history.append(p)
        return p

    def coordinator(self, *extra: str, kill_at: str | None = None, log_level: str = "debug") -> Proc:
        argv = ["coordinator", "--plan", str(self.plan_path), "--listen", f"{self.listen_host}:{self.port}",
                "--state", str(self.root / "coordinator"), "--json", "--allow-insecure-test-randomness", *extra]
        return self._start("coordinator", argv, kill_at, log_level=log_level)

    def configure_site(self, sid: str, data: Path, *extra: str, address: str | None = None, prefix=(),
                       reconnect_timeout: float = 60.0, state: Path | None = None) -> None:
        """Remember how to start site ``sid`` (:meth:`site` without ``data`` reuses it, e.g. after a kill)."""
        self.site_args[sid] = dict(data=data, extra=extra, address=address, prefix=prefix,
                                   reconnect_timeout=reconnect_timeout, state=state)

    def site(self, sid: str, data: Path | None = None, *extra: str, kill_at: str | None = None,
             address: str | None = None, prefix=(), reconnect_timeout: float = 60.0, state: Path | None = None
             ) -> Proc:
        """Start (or restart, with the same arguments as before unless ``data`` is given) site ``sid``."""
        if data is not None:
            self.configure_site(sid, data, *extra, address=address, prefix=prefix,
                                reconnect_timeout=reconnect_timeout, state=state)
        a = self.site_args[sid]
        argv = ["client", "--coordinator", a["address"] or self.address, "--site", sid, "--data", str(a["data"]),
                "--state", str(a["state"] or self.root / sid), "--json", "--reconnect-timeout",
                str(a["reconnect_timeout"]), "--allow-insecure-test-randomness",
                *pin_plan(self.plan_path, a["extra"]), *a["extra"]]
        return self._start(sid, argv, kill_at, prefix=a["prefix"])

    def stop(self) -> None:
        """Kill every live process (by pid) and write the event log next to the state directories."""
        for p in self.history:
            if p.alive:
                p.kill()
        self.write_events(self.root / "events.jsonl")

    def events_of(self, name: str, kind: str) -> list[dict]:
        with self.cond:
            return [e for e in self.events if e.get("_proc") == name and e.get("event") == kind]


# =========================================================================== kill orchestration


@dataclass
class KillLog:
    party: str
    point: str
    hooked: str
    seconds: float


def run_with_kill_points(fed: Federation, schedule: dict[str, list[str]], sites: list[str],
                         timeout: float, coordinator_args: tuple[str, ...] = (), strict: bool = True) -> list[KillLog]:
    """Run a federation in which every party SIGKILLs itself at its scheduled points, one after another.

    ``schedule[party]`` lists kill points (``stage@tree[:when]``, see fedsbdt.common.testhooks); the party is
    started with the first, and each time it dies there it is restarted at once with the next (the
    last incarnation runs without).  Returns when the coordinator and every site exited 0; fails
    (AssertionError with a diagnosis) on any other exit, on a SIGKILL that is not the scheduled
    one, on a scheduled point never reached (unless ``strict`` is false: a random schedule may name a
    stage that does not occur again, e.g. an epoch setup after the last epoch), or after ``timeout`` s.
    """
    t0 = time.monotonic()
    queues = {p: list(schedule.get(p, [])) for p in ["coordinator", *sites]}
    kills: list[KillLog] = []

    def start(party: str) -> Proc:
        point = queues[party].pop(0) if queues[party] else None
        if party == "coordinator":
            return fed.coordinator(*coordinator_args, kill_at=point)
        return fed.site(party, kill_at=point)

    mark = fed.mark()
    for party in queues:
        start(party)
    done: set[str] = set()
    while done != set(queues):
        left = timeout - (time.monotonic() - t0)
        ev = fed.wait_event(lambda e: e.get("event") == "_exit" and e["_inc"] == fed.current[e["_proc"]].incarnation,
                            timeout=max(left, 0.01), after=mark)
        mark = ev["_i"] + 1
        party, rc = ev["_proc"], ev["rc"]
        proc = fed.current[party]
        if rc == -signal.SIGKILL and proc.kill_at:
            assert proc.hooked is not None and proc.kill_at.split(",")[0].split(":")[0] in proc.hooked, \
                f"{party} was SIGKILLed, but not at its kill point {proc.kill_at}: {proc.hooked}"
            kills.append(KillLog(party, proc.kill_at, proc.hooked, round(time.monotonic() - t0, 2)))
            start(party)
            continue
        if rc == 0:
            done.add(party)
            if proc.kill_at and strict:
                raise AssertionError(f"{party} finished without reaching its kill point {proc.kill_at} "
                                     f"(points left: {queues[party]})")
            continue
        raise AssertionError(f"{party}#{proc.incarnation} exited with {rc} (kill point {proc.kill_at}):\n"
                             f"{proc.errors[-3000:]}\n{fed.diagnosis()}")
    left = {p: q for p, q in queues.items() if q}
    assert not left or not strict, f"kill points never used: {left}"
    return kills


def run_with_random_kills(fed: Federation, sites: list[str], seed: int, kills: int, trees_total: int,
                          timeout: float, coordinator_share: float = 0.3) -> list[KillLog]:
    """Seeded random-kill soak: ``kills`` kill points drawn from a seeded RNG (party, stage, tree, when).

    The parties are the coordinator (with probability ``coordinator_share``) and the sites; each
    party's points are sorted by tree so that they fire in order.  Trees are drawn from the first
    80 % of the run; a point whose stage does not occur again (an epoch setup after the last epoch,
    a site that only catches up at the end) simply does not fire.
    """
    from fedsbdt.common.testhooks import STAGES

    rng = random.Random(seed)
    schedule: dict[str, list[tuple[int, str]]] = {}
    for _ in range(kills):
        party = "coordinator" if rng.random() < coordinator_share else rng.choice(sites)
        stage = rng.choice(STAGES)
        tree = 0 if stage == "init_round" else rng.randrange(0, max(1, int(trees_total * 0.8)))
        when = rng.choice(("before", "after"))
        schedule.setdefault(party, []).append((tree, f"{stage}@{tree}:{when}"))
    ordered = {p: [pt for _, pt in sorted(v, key=lambda x: x[0])] for p, v in schedule.items()}
    # the initial score is released once: a second init_round point for the same party would never fire
    for p, pts in ordered.items():
        seen_init = False
        keep = []
        for pt in pts:
            if pt.startswith("init_round"):
                if seen_init:
                    continue
                seen_init = True
            keep.append(pt)
        ordered[p] = keep
    return run_with_kill_points(fed, ordered, sites, timeout, strict=False)


# =========================================================================== invariants


def read_checkpoint(coordinator_dir: Path) -> list[tuple[str, dict]]:
    db = sqlite3.connect(coordinator_dir / "coordinator.sqlite")
    try:
        return [(k, json.loads(b)) for k, b in db.execute("SELECT kind, body FROM log ORDER BY seq")]
    finally:
        db.close()


def read_ledger(state_dir: Path, plan_sha256: str) -> dict:
    from fedsbdt.client.ledger import ledger_path

    db = sqlite3.connect(ledger_path(state_dir, plan_sha256))
    try:
        spent = np.array([r[0] for r in db.execute("SELECT spent FROM ledger")], dtype=np.int64)
        contrib = db.execute("SELECT round_id, kind, tree, with_data FROM contributions").fetchall()
    finally:
        db.close()
    return {"spent": spent, "contributions": {r[0]: {"kind": r[1], "tree": r[2], "with_data": bool(r[3])}
                                              for r in contrib}}


def check_outcome(fed: Federation, plan, sites: list[str], records: dict[str, int], without_model=()) -> dict:
    """Everything a run that survived faults must satisfy; returns a summary for the test's message.

    1. the coordinator's and every site's model file are byte-identical (except ``without_model``: sites
       that are known to have stopped early);
    2. the checkpoint holds trees 0 … T−1 exactly once each, with strictly increasing, unique round
       ids, and the model's public record lists exactly those rounds;
    3. no tree index was announced as released twice by any coordinator incarnation;
    4. the privacy receipt counts exactly the released rounds and the plan's accounting;
    5. every record's spent units are within the filter budget (filter on), or every site sent data
       in at most the accounted number of tree rounds (filter off);
    6. every masked input the coordinator received (its debug log) was committed in the sender's
       ledger first (a contributions row for that round id), and every released round's sites
       committed that round;
    7. every site's ledger covers exactly its records.
    """
    from fedsbdt.client.site import model_path
    from fedsbdt.common.engine import filter_for

    hp = plan.hyperparameters
    ref = (fed.root / "coordinator" / "model.json").read_bytes()
    for s in sites:
        if s not in without_model:
            assert model_path(fed.root / s, plan.sha256).read_bytes() == ref, \
                f"{s}'s model differs from the coordinator's"
    model = json.loads(ref)
    log = read_checkpoint(fed.root / "coordinator")
    trees = [b for k, b in log if k == "tree"]
    assert [t["index"] for t in trees] == list(range(hp.total_rounds)), "checkpoint trees are not 0..T-1 once each"
    ids = [t["round_id"] for t in trees]
    assert ids == sorted(set(ids)), f"round ids not unique and increasing: {ids}"
    assert sum(1 for k, _ in log if k == "init") == (1 if hp.init_share > 0 else 0)
    assert [r["round_id"] for r in model["training"]["rounds"]] == ids
    assert [r["sites"] for r in model["training"]["rounds"]] == [t["sites"] for t in trees]
    released = [e["tree"] for e in fed.events if e.get("_proc") == "coordinator" and e.get("event") == "tree"]
    assert len(released) == len(set(released)), f"a tree was released twice: {sorted(released)}"
    cal = plan.calibration()
    rec = model["privacy"]
    assert rec["rounds_completed"] == hp.total_rounds == len(model["trees"])
    assert rec["rounds_accounted"] == cal.rounds == hp.accounted_rounds
    assert rec["epsilon"] == cal.epsilon and rec["sigma"] == cal.sigma
    budget = filter_for(hp, cal).budget_units if hp.filter else None
    received: dict[str, set[int]] = {}
    for e in fed.events:
        if e.get("_proc") == "coordinator" and e.get("event") == "input_received":
            received.setdefault(e["site"], set()).add(int(e["round_id"]))
    init_round = model["training"]["init"]
    summary = {"trees": len(trees), "max_spent_share": {}, "inputs_received": {}, "contributions": {}}
    for s in sites:
        led = read_ledger(fed.root / s, plan.sha256)
        assert len(led["spent"]) == records[s], f"{s}: ledger has {len(led['spent'])} records, data {records[s]}"
        contrib = led["contributions"]
        if budget is not None:
            assert led["spent"].max() <= budget, f"{s}: a record spent {led['spent'].max()} > budget {budget}"
            summary["max_spent_share"][s] = round(float(led["spent"].max()) / budget, 4)
        else:
            with_data = sum(1 for c in contrib.values() if c["kind"] == "tree" and c["with_data"])
            assert with_data <= hp.accounted_rounds, f"{s}: {with_data} data rounds > {hp.accounted_rounds}"
        missing = received.get(s, set()) - set(contrib)
        assert not missing, f"the coordinator received masked inputs from {s} for rounds {sorted(missing)} " \
                            f"that {s}'s ledger never committed"
        for t in trees:
            if s in t["sites"]:
                c = contrib.get(t["round_id"])
                assert c is not None and c["kind"] == "tree" and c["tree"] == t["index"], \
                    f"tree {t['index']} (round {t['round_id']}) counts {s}, whose ledger did not commit that round"
        if init_round and s in init_round["sites"]:
            assert contrib.get(init_round["round_id"], {}).get("kind") == "init"
        summary["inputs_received"][s] = len(received.get(s, ()))
        summary["contributions"][s] = len(contrib)
    return summary
