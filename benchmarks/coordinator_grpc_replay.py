"""The coordinator's CPU per round over real gRPC at n sites, without n site processes beside it (a script).

``federation_costs.py`` runs every site as its own process: at 100 sites on this 2-core machine that is a
load average of 70–100, and the coordinator's process time then includes what contention costs it (its code
and data evicted from the CPU caches by a hundred other processes between two of its steps).  The issue's
own measurement was on 16 cores without contention.  This harness measures the coordinator the same way
without the contention:

1. Record one in-process session of n sites (``session_scale.record``: Abalone sample, depth 6,
   distributed noise, fast rounds), and from it each site's messages in order, each with the number of
   events the coordinator had sent that site before it (a pre-pass replaying the calls into a fresh Session).
2. Start the coordinator in a process of its own as ``fedsbdt coordinator`` serves (importing what the CLI
   imports and no benchmark module but ``_join_tokens``, so its memory compares): the recorded plan, its
   SQLite checkpoint, the allocator and collector settings, ``CoordinatorServer`` on loopback with mutual
   TLS (a CA, a server certificate and one client certificate per site, made here).
3. One *driver* process plays the n sites over n real gRPC channels (each with its own site certificate):
   signed joins in the recorded order, a progress report, a ``Connect`` stream each; then it sends each
   recorded message on the site's stream (reports as unary calls) once that stream has delivered the events
   it waits for.  The sites' own work (gradients, masking) is not done again: their messages are the
   recorded bytes, so the driver costs about one gRPC client per site.

The coordinator's session is deterministic given the order of joins (insecure-test randomness, join tokens
from a counter), so it accepts the recorded messages and must release the recorded model (checked).  Per
run: the coordinator's CPU per tree round (process time between the second and the last release / rounds:
median and mean; the epoch setup falls before them), its peak RSS, the driver's CPU, the load average.

Run:  python benchmarks/coordinator_grpc_replay.py [--sites 100] [--trees 40] [--repeats 2] [--insecure]
Writes ``benchmarks/results/coordinator_grpc_replay.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _join_tokens import counter_bytes  # noqa: E402  (the coordinator process imports no other benchmark module)

#: the recorded plan's stage deadline: the replay must not miss one where the recording did not (a deadline
#: that passes changes the session, and the recorded messages no longer fit)
STAGE_SECONDS = 600
#: recorded coordinator calls that are a site's message, and how the driver sends each
STREAMED = {"submit_setup": "setup", "submit_input": "input", "submit_round": "round"}
REPORTED = ("report_progress", "report_refusal", "report_finished")


def script(n: int, trees: int, epoch_rounds: int, dump: Path) -> dict:
    """Record a session and write what the two processes need to ``dump``: the plan, the sites' identity
    keys, and each site's messages in order with the events it had been sent before each."""
    from cryptography.hazmat.primitives import serialization

    from fedsbdt.common.federation.plan import Plan
    from fedsbdt.server.session import Session
    from session_scale import record, replay_calls

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedsbdt-grpc-replay-") as tmp:
        rec = record(Path(tmp), n, trees, epoch_rounds=epoch_rounds, stage_seconds=STAGE_SECONDS)
        canonical, calls, start = rec["plan"].canonical_json, rec["calls"], rec["start"]
        model = rec["session"].model_json
        keys = {s: k.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                   serialization.NoEncryption()) for s, k in rec["keys"].items()}
        del rec
    plan = Plan.from_canonical_json(canonical)
    sent: dict[str, int] = {}  # events dispatched to each joined site so far
    joins: list[str] = []
    ops: dict[str, list] = {}

    def after(name, args, out):
        if name == "join":
            joins.append(args[0])
            sent[args[0]] = 0
            out = out[1]
        for site, _ in out:
            if site in sent:
                sent[site] += 1

    joining: set[str] = set()  # joined, not yet subscribed: the driver reports their progress itself
    replay = Session(plan, plan.make_randomness(True), start, None, randbytes=counter_bytes())
    for name, a, k, outcome in calls:  # each call noted before it runs
        site = a[0] if a else None
        if name == "join":
            joining.add(site)
        elif name == "subscribed":
            joining.discard(site)
        elif (name in STREAMED or name in REPORTED) and not (name == "report_progress" and site in joining):
            ops.setdefault(site, []).append((name, a[1:-1], sent.get(site, 0)))
        elif name not in ("tick", "report_progress"):
            raise RuntimeError(f"a recorded {name} call: not replayed by this harness")
        replay_calls(replay, [(name, a, k, outcome)], after)
    if replay.model_json != model:
        raise RuntimeError("the pre-pass released another model than the recorded session")
    dump.write_bytes(pickle.dumps({"plan": canonical, "keys": keys, "joins": joins, "ops": ops, "model": model}))
    return {"record_s": round(time.monotonic() - t0, 1), "calls": len(calls),
            "site_messages": sum(len(v) for v in ops.values())}


def make_pki(directory: Path, sites: list[str]) -> None:
    """A CA, the coordinator's certificate for localhost, one client certificate per site."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from fedsbdt.common.federation.pki import ca_init, ca_server, ca_sign, make_csr, write_private, write_public

    ca = directory / "ca"
    ca.mkdir(parents=True)
    ca_init(ca)
    ca_server(ca, directory / "coordinator", ["localhost", "127.0.0.1"])
    for s in sites:
        d = directory / s
        d.mkdir()
        key = ec.generate_private_key(ec.SECP256R1())
        write_private(d / "tls.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
        write_public(d / "site.csr", make_csr(key, s).public_bytes(serialization.Encoding.PEM))
        ca_sign(ca, d / "site.csr", d / "tls.crt")


def _status_mib(field: str = "VmHWM") -> float:
    """A memory line of /proc/self/status (peak RSS by default) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process by name (threads of one name summed)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _timed_methods() -> dict[str, float]:
    """``--breakdown``: the event loop's CPU inside a few session methods (wrapped here, inclusive; each
    wrapper adds two thread-clock reads)."""
    from fedsbdt.common.secagg import coordinator
    from fedsbdt.server import session

    spent: dict[str, float] = {}
    targets = [(session.Session, "_decode"), (session.Session, "_step_pipeline"), (session.Session, "_step_rounds"),
               (session.Session, "_release"), (session.Session, "_advance"),
               (coordinator.CoordinatorRound, "finalize"), (coordinator.CoordinatorRound, "receive")]
    for cls, name in targets:
        fn = getattr(cls, name)
        spent[name] = 0.0

        def wrapped(*a, _fn=fn, _name=name, **k):
            t0 = time.thread_time()
            try:
                return _fn(*a, **k)
            finally:
                spent[_name] += time.thread_time() - t0
        setattr(cls, name, wrapped)
    return spent


def _option(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    return name, int(value)


async def _disable(prof) -> None:
    prof.disable()


def serve(dump: Path, pki: Path | None, state: Path, cprofile: Path | None = None, breakdown: bool = False,
          options: tuple = ()) -> None:
    """The coordinator process: serve the recorded plan until the session ends; print one JSON line."""
    import numpy as np

    from fedsbdt.common.federation.pki import TlsFiles, server_credentials
    from fedsbdt.common.federation.plan import Plan
    from fedsbdt.server.checkpoint import CoordinatorStore
    from fedsbdt.server.collector import quiet_collector
    from fedsbdt.server.malloc import map_large_buffers
    from fedsbdt.server.service import CoordinatorServer
    from fedsbdt.server.session import Session

    for module in ("fedsbdt.cli",):  # what `fedsbdt coordinator` has loaded (every command module): a
        importlib.import_module(module)                          # comparable resident size

    map_large_buffers()
    d = pickle.loads(dump.read_bytes())
    plan = Plan.from_canonical_json(d["plan"])
    session = Session(plan, plan.make_randomness(True), time.monotonic(), CoordinatorStore(state, plan.sha256),
                      randbytes=counter_bytes())
    if options:  # an experiment with the server's channel arguments (the product's stay as they are)
        from fedsbdt.server import service

        service.SERVER_OPTIONS = tuple(service.SERVER_OPTIONS) + tuple(options)
    creds = server_credentials(TlsFiles.in_dir(pki / "coordinator")) if pki else None
    server = CoordinatorServer(session, "localhost:0" if pki else "127.0.0.1:0", creds)
    marks: list[tuple[int, float]] = []  # (trees released, process time) at each release
    threads: list[dict] = []  # each thread's CPU seconds at the second and at the latest release
    prof = cProfile.Profile() if cprofile else None
    setup_peak = [float("nan")]  # peak RSS when the first tree is released (the epoch setup's peak)

    def observe() -> None:
        k = len(session.trees)
        if k and (not marks or marks[-1][0] != k):
            marks.append((k, time.process_time()))
            snapshot = {**_thread_cpu(), "event loop": time.thread_time(),
                        "event loop: session steps": in_session[0], **{f"in {m}": v for m, v in spent.items()}}
            if len(marks) == 2:  # the first timed release (the epoch setup falls before it)
                threads[:] = [snapshot]
            elif len(marks) > 2:  # the latest release
                threads[1:] = [snapshot]
            if len(marks) == 1:  # the epoch setup is over
                setup_peak[0] = _status_mib()
            if len(marks) == 2 and prof is not None:
                prof.enable()  # on the event loop's thread, which runs every session step

    server.service.observers.append(observe)
    in_session = [0.0]  # the event loop's CPU inside the site messages' session steps (and their dispatch)
    site_message = server.service._site_message

    def timed_site_message(*a):
        t0 = time.thread_time()
        try:
            return site_message(*a)
        finally:
            in_session[0] += time.thread_time() - t0

    server.service._site_message = timed_site_message
    spent = _timed_methods() if breakdown else {}
    quiet_collector()
    server.start()
    print(server.port, flush=True)
    cpu0 = time.process_time()
    server.wait()
    cpu = time.process_time() - cpu0
    if prof is not None:
        server._run(_disable(prof))
        prof.dump_stats(cprofile)
    server.stop()
    session.close()
    if session.model_json != d["model"]:
        raise SystemExit("the coordinator released another model than the recorded session")
    steps = np.diff([c for _, c in marks[1:]])
    rounds = marks[-1][0] - marks[1][0]
    print(json.dumps({
        "rounds_timed": rounds,
        "coordinator_cpu_ms_per_round_median": round(float(np.median(steps)) * 1e3, 2),
        "coordinator_cpu_ms_per_round_mean": round((marks[-1][1] - marks[1][1]) / rounds * 1e3, 2),
        "coordinator_cpu_s_total": round(cpu, 2),
        # CPU per round by thread (the event loop: the session and grpc.aio's Python side; gRPC's own threads)
        "thread_cpu_ms_per_round": {name: round((threads[1].get(name, 0) - threads[0].get(name, 0)) / rounds * 1e3, 2)
                                    for name in threads[1]},
        "coordinator_peak_rss_mib": round(_status_mib(), 1),
        "coordinator_peak_rss_mib_by_first_release": round(setup_peak[0], 1),
        "bytes_in": server.service.bytes_in, "bytes_out": server.service.bytes_out}), flush=True)


async def _drive(dump: Path, pki: Path | None, port: int) -> dict:
    import grpc
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedsbdt.common.federation.pki import TlsFiles, channel_credentials
    from fedsbdt.common.federation.plan import Plan
    from fedsbdt.common.federation.wire import GRPC_OPTIONS, sign_join
    from fedsbdt.proto.v1 import federation_pb2 as pb
    from fedsbdt.proto.v1 import federation_pb2_grpc as pbg

    d = pickle.loads(dump.read_bytes())
    plan = Plan.from_canonical_json(d["plan"])
    channels, stubs, tokens, calls, seen, wakes = {}, {}, {}, {}, {}, {}
    for s in d["joins"]:
        if pki:
            ch = grpc.aio.secure_channel(f"localhost:{port}", channel_credentials(TlsFiles.in_dir(pki / s)),
                                         options=list(GRPC_OPTIONS))
        else:
            ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=list(GRPC_OPTIONS))
        channels[s], stubs[s] = ch, pbg.FederationStub(ch)

    failed: list[Exception] = []  # a rejected message: the session went another way (e.g. a deadline passed)

    async def read(s: str, call) -> None:
        async for batch in call:
            if batch.rejected:
                failed.append(RuntimeError(f"{s}: the coordinator rejected a recorded message: "
                                           f"{list(batch.rejected)}"))
                for w in wakes.values():
                    w.set()
                return
            if batch.events:
                seen[s] = batch.events[-1].seq
                wakes[s].set()

    readers = []
    for s in d["joins"]:  # in the recorded order: the join tokens come from a counter
        nonce = os.urandom(32)
        key = Ed25519PrivateKey.from_private_bytes(d["keys"][s])
        resp = await stubs[s].Join(pb.JoinRequest(plan_sha256=plan.sha256, site_id=s, nonce=nonce,
                                                  signature=sign_join(key, plan.sha256, s, nonce), trees_applied=0))
        tokens[s] = bytes(resp.token)
        await stubs[s].Report(pb.ReportRequest(site_id=s, token=tokens[s], kind=pb.REPORT_PROGRESS, trees_applied=0))
        seen[s], wakes[s] = 0, asyncio.Event()
        calls[s] = stubs[s].Connect()
        await calls[s].write(pb.SiteMessage(subscribe=pb.SubscribeRequest(site_id=s, token=tokens[s], after_seq=0)))
        readers.append(asyncio.ensure_future(read(s, calls[s])))

    async def site(s: str) -> None:
        token, stub, call = tokens[s], stubs[s], calls[s]
        for name, args, need in d["ops"].get(s, []):
            while seen[s] < need and not failed:
                wakes[s].clear()
                try:
                    await asyncio.wait_for(wakes[s].wait(), 300)
                except TimeoutError:
                    raise RuntimeError(f"{s}: waited 300 s for event {need} before its {name} (seen {seen[s]})")
            if failed:
                raise failed[0]
            if name == "submit_input":
                purpose, tree, secagg = args
                await call.write(pb.SiteMessage(input=pb.MaskedInputSubmission(
                    site_id=s, token=token, purpose=int(purpose), tree=tree, secagg=secagg)))
            elif name in STREAMED:
                sub = pb.SecAggSubmission(site_id=s, token=token, secagg=args[0])
                await call.write(pb.SiteMessage(**{STREAMED[name]: sub}))
            elif name == "report_progress":
                await stub.Report(pb.ReportRequest(site_id=s, token=token, kind=pb.REPORT_PROGRESS,
                                                   trees_applied=args[0]))
            elif name == "report_finished":
                await stub.Report(pb.ReportRequest(site_id=s, token=token, kind=pb.REPORT_FINISHED,
                                                   model_sha256=args[0]))
            else:
                raise RuntimeError(f"{s}: a recorded {name} (not replayed by this harness)")

    cpu0 = time.process_time()
    await asyncio.gather(*(site(s) for s in d["joins"]))
    cpu = time.process_time() - cpu0
    for s in d["joins"]:
        await calls[s].done_writing()
    for r in readers:
        r.cancel()
    for ch in channels.values():
        await ch.close()
    return {"driver_cpu_s": round(cpu, 2)}


def drive(dump: Path, pki: Path | None, port: int) -> None:
    print(json.dumps(asyncio.run(_drive(dump, pki, port))), flush=True)


def one_run(dump: Path, pki: Path | None, python: str, profile: Path | None = None, breakdown: bool = False,
            server_options: list[str] = ()) -> dict:
    """One coordinator and one driver process; their two JSON lines merged, with the load average.
    ``profile``: ``*.prof``, cProfile of the event loop's thread from the second release on; otherwise the
    coordinator runs under ``py-spy record`` (raw stacks of the whole run into that file)."""
    with tempfile.TemporaryDirectory(prefix="fedsbdt-grpc-replay-state-") as state:
        base = [python, __file__, "--dump", str(dump)] + (["--pki", str(pki)] if pki else [])
        spy, serve = [], ["--serve", state] + (["--breakdown"] if breakdown else [])
        for x in server_options:
            serve += ["--server-option", x]
        if profile is not None and profile.suffix == ".prof":
            serve += ["--cprofile", str(profile)]
        elif profile is not None:
            spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--rate", "100", "--format", "raw",
                   "-o", str(profile), "--"]
        load0 = os.getloadavg()
        coord = subprocess.Popen(spy + base + serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = coord.stdout.readline()
        while line and not line.strip().isdigit():  # py-spy's own lines come first
            line = coord.stdout.readline()
        port = int(line)
        driver = subprocess.run(base + ["--drive", str(port)], capture_output=True, text=True, timeout=3600)
        if driver.returncode:
            coord.kill()
        out, err = coord.communicate(timeout=600)
        if coord.returncode or driver.returncode:
            raise RuntimeError(f"a run failed:\n{err[-3000:]}\n{driver.stderr[-3000:]}")
        last = [x for x in out.splitlines() if x.startswith("{")][-1]  # after it py-spy's own lines
        return {**json.loads(last), **json.loads(driver.stdout.strip().splitlines()[-1]),
                "load_average_before": [round(x, 2) for x in load0],
                "load_average_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=100)
    ap.add_argument("--trees", type=int, default=40)
    ap.add_argument("--epoch-rounds", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--insecure", action="store_true", help="plain-text gRPC instead of mutual TLS")
    ap.add_argument("--baseline-python", help="also run the coordinator and driver with this interpreter "
                                              "(another checkout's venv), alternately")
    ap.add_argument("--script", type=Path, help="the recorded session: reused if the file exists, else recorded "
                                                "into it (recording 100 sites takes minutes)")
    ap.add_argument("--profile", type=Path, help="profile the first run's coordinator: "
                    "FILE.prof: cProfile of its event loop from the second release on; else py-spy's raw stacks")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time a few session methods inside the coordinator (adds a little CPU)")
    ap.add_argument("--server-option", action="append", default=[], metavar="NAME=INT",
                    help="add a gRPC channel argument to the coordinator's server (an experiment), e.g. "
                         "grpc.http2.bdp_probe=0; repeatable")
    ap.add_argument("--out", default="coordinator_grpc_replay")
    ap.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--pki", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cprofile", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--drive", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.dump, args.pki, args.serve, args.cprofile, args.breakdown,
                     tuple(_option(x) for x in args.server_option))
    if args.drive:
        return drive(args.dump, args.pki, args.drive)
    from _util import save

    with tempfile.TemporaryDirectory(prefix="fedsbdt-grpc-replay-") as tmp:
        dump = args.script or Path(tmp) / "script.pickle"
        if dump.exists():
            head = {"script": str(dump)}
        else:
            head = script(args.sites, args.trees, args.epoch_rounds, dump)
            print(f"recorded {args.sites} sites, {args.trees} trees: {head}", flush=True)
        pki = None
        if not args.insecure:
            pki = Path(tmp) / "pki"
            make_pki(pki, pickle.loads(dump.read_bytes())["joins"])
        versions = [("this_tree", sys.executable)] + ([("baseline", args.baseline_python)]
                                                      if args.baseline_python else [])
        runs: dict[str, list] = {name: [] for name, _ in versions}
        for i in range(args.repeats):
            for name, python in versions:
                r = one_run(dump, pki, python, args.profile if (i, name) == (0, "this_tree") else None, args.breakdown,
                            args.server_option)
                runs[name].append(r)
                print(f"run {i + 1}/{args.repeats} {name}: {r}", flush=True)
    summary = {name: {k: statistics.median(r[k] for r in rs) for k in
                      ("coordinator_cpu_ms_per_round_median", "coordinator_cpu_ms_per_round_mean",
                       "coordinator_peak_rss_mib", "driver_cpu_s")} for name, rs in runs.items()}
    save(args.out, {"description": "the coordinator over real gRPC (mutual TLS unless insecure) at n sites played "
                                   "by one driver process replaying a recorded session: no n site processes",
                    "setting": {"sites": args.sites, "trees": args.trees, "epoch_rounds": args.epoch_rounds,
                                "tls": not args.insecure, "server_options": args.server_option, **head},
                    "summary": summary, "runs": runs})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
