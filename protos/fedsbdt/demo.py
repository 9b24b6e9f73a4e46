"""``fedsbdt demo``: a whole federation on loopback, as separate processes, with mutual TLS.

    fedsbdt demo [--sites N] [--dataset abalone|adult] [--settings auto|paper] [--trees N] [--status-port PORT] [--json]
    fedsbdt demo --data FILE --schema S [--sites N] [--split-by COLUMN] [--json]

1. makes a throw-away consortium CA, a coordinator certificate for
   localhost, and for every site an identity key, a TLS key and a certificate
   (``fedsbdt ca`` / ``fedsbdt keygen`` code paths);
2. splits the bundled data: Abalone — a public, fixed shuffle holds out 20 %
   for testing; Adult — ``adult.test`` is the test set; the training part is
   dealt round-robin to the sites, each file in the original format;
3. writes the plan (privacy statement computed, public split seed fixed; the
   ``auto`` settings of ``fedsbdt train --rows N`` for the N records the sites
   train on, declared public as ``fedsbdt plan --rows N`` does) and
   starts ``fedsbdt coordinator`` and one ``fedsbdt client`` per site as
   child processes, each site checking the plan hash it was given;
4. shows progress from the coordinator's JSON log, waits, checks that every
   party wrote the byte-identical model; each site evaluates it on its own part
   of the held-out data and the coordinator releases only the aggregate
   metrics (federated evaluation at ``--eval-epsilon``, docs/federated-evaluation.md:
   ``federated`` in ``--json``); for comparison the demo also evaluates the
   pooled held-out data.  ``--json`` prints the ``evaluate`` keys plus ``epsilon``, ``delta``,
   ``sites``, ``trees``, ``dataset``, ``rows`` (training records used), ``dropped``
   (rows with a missing value, not used), ``model_sha256`` and ``seconds``
   (design.md "Command line").

Before the processes start, the numba kernels are compiled once in this
process and written to the on-disk cache (≈ 15 s on the very first run, saying
so), so that the coordinator and every site load them instead of each
compiling them silently.

``--prepare DIR`` only writes the CA, keys, certificates, plan and data
splits into DIR (for ``docker compose up``, see docs/federation.md).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import fedsbdt.examples
from fedsbdt.common.cli import CliError, Progress, emit

EXAMPLES = Path(fedsbdt.examples.__file__).parent  # the bundled data (examples/ of the repository)
DATASETS = ("abalone", "adult")
log = logging.getLogger("fedsbdt.demo")


@dataclass
class Layout:
    """Where the demo puts things (the same layout docker-compose.yml mounts)."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca"

    @property
    def plan(self) -> Path:
        return self.root / "plan" / "plan.toml"

    @property
    def coordinator(self) -> Path:
        return self.root / "coordinator"

    def site_state(self, sid: str) -> Path:
        return self.root / sid

    def site_data(self, sid: str) -> Path:
        return self.root / "data" / sid / "data.csv"

    def site_eval(self, sid: str) -> Path:
        """The site's held-out part of the test set (for the federated evaluation)."""
        return self.root / "data" / sid / "eval.csv"

    @property
    def test_data(self) -> Path:
        return self.root / "data" / "test.csv"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def site_ids(n: int) -> list[str]:
    return [f"hospital-{i + 1}" for i in range(n)]


def split_data(dataset: str, n: int, layout: Layout) -> int:
    """Write the sites' training files, the held-out test file and its share per site; returns the training rows."""
    folder = EXAMPLES / dataset
    if dataset == "abalone":
        lines = [ln for ln in (folder / "abalone.data").read_text().splitlines() if ln.strip()]
        order = np.random.default_rng(0).permutation(len(lines))  # public, fixed split of public data
        n_test = len(lines) // 5
        test = [lines[i] for i in sorted(order[:n_test])]
        train = [lines[i] for i in sorted(order[n_test:])]
        layout.test_data.parent.mkdir(parents=True, exist_ok=True)
        layout.test_data.write_text("\n".join(test) + "\n")
    else:
        train = [ln for ln in (folder / "adult.data").read_text().splitlines() if ln.strip()]
        layout.test_data.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "adult.test", layout.test_data)
    held_out = [ln for ln in layout.test_data.read_text().splitlines() if ln.strip() and not ln.startswith("|")]
    for k, sid in enumerate(site_ids(n)):
        p = layout.site_data(sid)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(train[k::n]) + "\n")
        layout.site_eval(sid).write_text("\n".join(held_out[k::n]) + "\n")
    return len(train)


@dataclass(frozen=True)
class CustomData:
    """``fedsbdt demo --data FILE --schema S [--split-by COLUMN]``: a CSV file described by a schema."""

    data: Path
    schema: Path
    split_by: str | None = None


def _custom_lines(custom: CustomData, schema) -> tuple[str | None, list[str], list[str]]:
    """(header line or None, data lines, each line's --split-by value ([] without it)) of a custom CSV file."""
    fmt = schema.format
    if custom.data.suffix.lower() in (".parquet", ".pq"):
        raise CliError(f"{custom.data}: the demo deals CSV lines to its sites; convert the Parquet file to CSV")
    try:
        text = custom.data.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"{custom.data}: cannot read the data file ({e})") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not (fmt.comment and ln.startswith(fmt.comment))]
    header = lines.pop(0) if fmt.header and lines else None
    if len(lines) < 10:
        raise CliError(f"{custom.data}: {len(lines)} data lines; a demo needs at least 10 (2 held out per 10)")
    if custom.split_by is None:
        return header, lines, []

    def fields(line: str) -> list[str]:
        if len(fmt.separator) == 1:
            return next(csv.reader([line], delimiter=fmt.separator))
        return line.split(fmt.separator)

    names = [c.strip() for c in fields(header)] if header is not None else list(schema.columns)
    if custom.split_by not in names:
        raise CliError(f"--split-by {custom.split_by!r}: no such column in {custom.data} "
                       f"(columns: {', '.join(names)})")
    k = names.index(custom.split_by)
    values = []
    for i, line in enumerate(lines):
        f = fields(line)
        if k >= len(f):
            raise CliError(f"{custom.data}: data line {i + 1} has no field {custom.split_by!r}")
        values.append(f[k].strip())
    return header, lines, values


def custom_site_count(custom: CustomData, requested: int | None) -> int:
    """Sites of a custom demo: --sites, or with --split-by (and no --sites) one per value of the column."""
    from fedsbdt.common.schema import Schema

    if custom.split_by is None:
        return 3 if requested is None else requested
    _, _, values = _custom_lines(custom, Schema.load(custom.schema))
    groups = len(set(values))
    if requested is not None and groups < requested:
        raise CliError(f"--split-by {custom.split_by!r} has {groups} values, fewer than the {requested} sites")
    return groups if requested is None else requested


def split_custom(custom: CustomData, schema, n: int, layout: Layout) -> int:
    """Like :func:`split_data` for a custom CSV file: a public, fixed shuffle holds out 20 % for testing; the
    rest (and the held-out part) is dealt to the ``n`` sites round-robin or, with ``split_by``, by the
    column's value (the sorted values in turn: value j goes to site j mod n).  Returns the training lines."""
    header, lines, values = _custom_lines(custom, schema)
    order = np.random.default_rng(0).permutation(len(lines))
    test = set(int(i) for i in order[:len(lines) // 5])
    if values:
        groups = sorted(set(values))
        if len(groups) < n:
            raise CliError(f"--split-by {custom.split_by!r} has {len(groups)} values, fewer than the {n} sites")
        site_of_value = {v: j % n for j, v in enumerate(groups)}
        site_of = [site_of_value[v] for v in values]
    else:
        site_of = [None] * len(lines)
    train = [i for i in range(len(lines)) if i not in test]
    held = sorted(test)
    top = [header] if header is not None else []

    def write(path: Path, idx: list[int]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(top + [lines[i] for i in idx]) + "\n")

    write(layout.test_data, held)
    for k, sid in enumerate(site_ids(n)):
        if values:
            mine, mine_held = [i for i in train if site_of[i] == k], [i for i in held if site_of[i] == k]
        else:
            mine, mine_held = train[k::n], held[k::n]
        write(layout.site_data(sid), mine)
        write(layout.site_eval(sid), mine_held)
    return len(train)


def training_rows(layout: Layout, sites: list[str], schema) -> tuple[int, int]:
    """(records the sites train on, rows dropped for a missing value) — as each site will load its file."""
    from fedsbdt.common.data import load

    used = dropped = 0
    for sid in sites:
        ds = load(layout.site_data(sid), schema)
        used, dropped = used + ds.n, dropped + ds.dropped
    return used, dropped


def warm_up_kernels(schema, hp, quiet: bool = False, notice_after: float = 1.0) -> float:
    """Compile (first run) or load (later runs) the numba kernels of this configuration once, here, on a few
    synthetic records, so that the coordinator and the sites load them from the on-disk cache.  If that takes
    longer than ``notice_after`` seconds, say why.  Returns the seconds it took."""
    from fedsbdt.common.data import Dataset
    from fedsbdt.common.engine import train

    X = np.array([[0.0 if f.is_categorical else f.lo for f in schema.features]] * 8)
    y = np.full(8, schema.label_range[0] if schema.task == "regression" else 0.0)
    ds = Dataset(X, y, np.arange(8, dtype=np.int64), schema, source="warm-up")
    done = threading.Event()

    def notice() -> None:
        if not done.wait(notice_after) and not quiet:
            log.info("compiling kernels (first run only; later runs load them from the cache) …",
                     extra={"event": "compiling"})

    threading.Thread(target=notice, daemon=True).start()
    t0 = time.perf_counter()
    try:
        train(ds, hp.replace(trees=2, extra_trees=1 if hp.filter else 0, seed=hp.seed or 1))
    finally:
        done.set()
    secs = time.perf_counter() - t0
    if secs > notice_after and not quiet:
        log.info(f"kernels ready in {secs:.1f}s", extra={"event": "compiled", "seconds": round(secs, 3)})
    return secs


def prepare(layout: Layout, n: int, dataset: str, hp_changes: dict, hosts: list[str],
            max_epsilon: float | None = None, custom: CustomData | None = None, settings: str = "paper",
            **session) -> tuple[object, int]:
    """CA, coordinator certificate, site keys and certificates, data splits and the plan.

    ``hp_changes``: the hyperparameters given; ``settings``: what the others take — ``"paper"`` (the S-BDT
    paper's defaults; the default here, so that the benchmarks built on this function keep their settings) or
    ``"auto"`` (``fedsbdt demo``'s default: the rule of common/auto.py for the records the sites train on,
    declared public as ``fedsbdt plan --rows N`` declares them, so the demo trains what ``fedsbdt train --rows N``
    trains on the same records)."""
    from fedsbdt.common.federation.keys import IDENTITY_PUB, keygen, read_identity_pub
    from fedsbdt.common.auto import resolve
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.schema import Schema

    from fedsbdt.common.federation.pki import ca_init, ca_server, ca_sign
    from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan

    ca_init(layout.ca, name="fedsbdt demo CA", days=30)
    ca_server(layout.ca, layout.coordinator, hosts, days=30)
    entries = []
    for sid in site_ids(n):
        d = layout.site_state(sid)
        keygen(sid, d)
        ca_sign(layout.ca, d / "tls.csr", d / "tls.crt", days=30)
        entries.append(SiteEntry(sid, read_identity_pub(d / IDENTITY_PUB)))
    if custom is None:
        rows = split_data(dataset, n, layout)
        schema = Schema.load(EXAMPLES / dataset / "schema.toml")
    else:
        schema = Schema.load(custom.schema)
        rows = split_custom(custom, schema, n, layout)
    declared = training_rows(layout, site_ids(n), schema)[0] if settings == "auto" else None
    keys, _ = resolve(hp_changes, schema, declared, "declared", settings)
    hp = Hyperparameters.from_dict(keys).replace(seed=hp_changes.get("seed") or secrets.randbits(31))
    session.setdefault("deadlines", Deadlines(join=60.0, stage=10.0, quorum=120.0, finish=10.0))
    plan = make_plan(schema, hp, entries, session_id=f"fedsbdt-demo-{dataset}",
                     max_records_per_site=max(rows, 1), **session)
    layout.plan.parent.mkdir(parents=True, exist_ok=True)
    plan.save(layout.plan)
    return plan, rows


# --------------------------------------------------------------------------- running the processes


@dataclass
class Processes:
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def kill_all(self, grace: float = 10.0) -> None:
        """Stop the children that still run: SIGTERM (each stops cleanly), SIGKILL after ``grace`` seconds."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + grace
        for p in running:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedsbdt.cli", "--log-format", "json", *args]


def free_port() -> int:
    """A currently free loopback port (the coordinator binds it moments later; a clash fails loudly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_coordinator(layout: Layout, procs: Processes, listen: str = "127.0.0.1:0",
                       extra: list[str] = ()) -> tuple[subprocess.Popen, object]:
    """Start the coordinator; returns the process and a function that blocks until it serves (→ address)."""
    r, w = os.pipe()
    cmd = _cli("coordinator", "--plan", str(layout.plan), "--listen", listen, "--state",
               str(layout.coordinator), "--ready-fd", str(w), "--json", *extra)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(w,), text=True)
    os.close(w)
    procs.procs["coordinator"] = p

    def address() -> str:
        with os.fdopen(r) as fh:
            addr = fh.readline().strip()  # blocks until the coordinator serves (or exits: EOF)
        if not addr:
            p.wait(timeout=30)
            raise CliError("the coordinator did not start: " + _tail(p.stderr.read()))
        return addr

    return p, address


def start_coordinator(layout: Layout, procs: Processes, extra: list[str] = ()) -> tuple[str, subprocess.Popen]:
    """Start the coordinator on a free loopback port; returns (address, process) once it serves."""
    p, address = launch_coordinator(layout, procs, extra=extra)
    return address(), p


def site_flags(plan) -> list[str]:
    """What a site of this demo passes besides its files: the plan's hash (pinned) and a policy that accepts
    the demo's own plan (a two-site demo, central noise when asked for)."""
    from fedsbdt.client.policy import MIN_SITES

    flags = ["--plan-hash", plan.sha256, "--min-sites", str(min(plan.n, MIN_SITES))]
    return flags + (["--allow-central-noise"] if plan.noise == "central" else [])


def start_site(layout: Layout, sid: str, address: str, plan, procs: Processes,
               extra: list[str] = ()) -> subprocess.Popen:
    """Start ``fedsbdt client`` for site ``sid`` of ``plan`` (pinned by its hash; see :func:`site_flags`)."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    cmd = _cli("client", "--coordinator", f"localhost:{address.rsplit(':', 1)[1]}", "--site", sid,
               "--data", str(layout.site_data(sid)), "--state", str(layout.site_state(sid)),
               *site_flags(plan), "--json", *extra)
    err = open(layout.logs / f"{sid}.log", "w")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    procs.procs[sid] = p
    return p


def _tail(text: str, lines: int = 5) -> str:
    out = []
    for ln in text.strip().splitlines()[-lines:]:
        try:
            out.append(json.loads(ln).get("msg", ln))
        except (json.JSONDecodeError, AttributeError):
            out.append(ln)
    return " | ".join(out) or "(no output)"


def follow_log(stream, on_event, keep: list[str], tee: Path | None = None) -> threading.Thread:
    """Read a child's JSON log lines as they come (copying them to ``tee``); call ``on_event(record)`` for each."""

    def run() -> None:
        if tee is not None:
            tee.parent.mkdir(parents=True, exist_ok=True)
        fh = open(tee, "a") if tee is not None else None
        for line in stream:
            if fh is not None:
                fh.write(line)
                fh.flush()
            keep.append(line)
            del keep[:-200]
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                on_event(rec)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def query_to_csv(src, schema, out: Path) -> Path:
    """``demo --data URL --query Q``: the query's rows as a CSV file in the schema's format (separator, header,
    column order) at ``out`` — the demo deals CSV lines to its throw-away sites."""
    from fedsbdt.common.data import DataError
    from fedsbdt.common.sqlread import read_frame

    try:
        frame = read_frame(src, schema)
    except DataError as e:
        raise CliError(str(e)) from None
    missing = [c for c in schema.columns if c not in frame.columns]
    if missing:
        raise CliError(f"{src.display}: the query has no column {missing[0]!r} of the schema")
    fmt = schema.format
    with open(out, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, delimiter=fmt.separator if len(fmt.separator) == 1 else ",", lineterminator="\n")
        if fmt.header:
            w.writerow(schema.columns)
        for row in frame[list(schema.columns)].itertuples(index=False):
            w.writerow(["" if v is None or v != v else v for v in row])
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    from fedsbdt.common.sources import DataSource, source_from_args
    from fedsbdt.common.statuspage import StatusPageError, status_token

    try:  # the coordinator's page flags, checked before anything starts (beyond loopback: a token)
        status_token(args, "coordinator's status page")
    except StatusPageError as e:
        raise CliError(str(e)) from None
    src = source_from_args(args)
    if not isinstance(src, DataSource):
        return _demo(args)
    if args.schema is None:
        raise CliError("a custom demo needs both --data and --schema S (--split-by is optional)")
    from fedsbdt.common.schema import Schema

    tmp = Path(tempfile.mkdtemp(prefix="fedsbdt-demo-query-"))
    try:
        args.data = str(query_to_csv(src, Schema.load(args.schema), tmp / "query.csv"))
        return _demo(args, name=src.display)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _demo(args: argparse.Namespace, name: str | None = None) -> int:
    custom = _demo_data(args, name)
    hp = {k: v for k, v in (("epsilon", args.epsilon), ("trees", args.trees), ("depth", args.depth),
                            ("seed", args.seed)) if v is not None}
    hosts = args.host or ["localhost", "127.0.0.1"]
    if args.prepare:
        return _prepare_only(args, hp, hosts, custom)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="fedsbdt-demo-")) if args.workdir is None else Path(args.workdir)
    layout = Layout(tmp)
    procs = Processes()
    ok = False
    try:
        plan, _ = prepare(layout, args.sites, args.dataset, hp, hosts, custom=custom, eval_epsilon=args.eval_epsilon,
                          settings=args.settings)
        rows, dropped = training_rows(layout, list(plan.site_ids), plan.schema)
        warm_up_kernels(plan.schema, plan.hyperparameters, quiet=args.json)
        out, site_results = _run_federation(args, layout, plan, procs)
        reference = _identical_models(layout, site_results)
        _emit_result(args, plan, layout, json.loads(out).get("evaluation") or {}, reference, rows, dropped, t0)
        ok = True
        return 0
    finally:
        procs.kill_all()
        if args.workdir is None and (ok or not args.keep_on_failure):
            shutil.rmtree(tmp, ignore_errors=True)
        elif not ok:
            print(f"fedsbdt demo: files and logs kept in {tmp}", file=sys.stderr)


def _demo_data(args: argparse.Namespace, name: str | None) -> CustomData | None:
    """The demo's data: the user's file and schema (``--data``, ``--schema``, ``--split-by``; checked before
    anything is written) or a bundled dataset; sets ``args.dataset`` and ``args.sites`` (2 to 20)."""
    custom = None
    if args.data is not None or args.schema is not None or args.split_by is not None:
        if args.data is None or args.schema is None:
            raise CliError("a custom demo needs both --data FILE and --schema S (--split-by is optional)")
        if args.dataset is not None:
            raise CliError("--dataset picks a bundled dataset; leave it out with --data")
        custom = CustomData(Path(args.data), Path(args.schema), args.split_by)
        from fedsbdt.common.schema import Schema

        Schema.load(custom.schema)  # a bad schema (or a draft's data-derived marks) before anything is written
        args.sites = custom_site_count(custom, args.sites)
        args.dataset = name or custom.data.name
    else:
        args.dataset = args.dataset or "abalone"
        args.sites = 3 if args.sites is None else args.sites
    if not 2 <= args.sites <= 20:
        raise CliError(f"--sites must be between 2 and 20 for a demo on one machine (got {args.sites})")
    return custom


def _prepare_only(args: argparse.Namespace, hp: dict, hosts: list[str], custom: CustomData | None) -> int:
    """``--prepare DIR``: the CA, keys, certificates, plan and data splits written into a fresh DIR."""
    layout = Layout(Path(args.prepare))
    if layout.root.exists() and any(layout.root.iterdir()):
        raise CliError(f"{layout.root} is not empty; --prepare writes a fresh directory")
    plan, _ = prepare(layout, args.sites, args.dataset, hp, hosts, custom=custom, settings=args.settings)
    rows, dropped = training_rows(layout, list(plan.site_ids), plan.schema)
    emit(args, {"dir": str(layout.root), "plan_sha256": plan.sha256, "sites": list(plan.site_ids),
                "rows": rows, "dropped": dropped},
         f"wrote CA, certificates, keys, data splits ({_rows_text(rows, dropped)}) and {layout.plan}\n"
         f"plan hash: {plan.sha256}")
    return 0


def _run_federation(args: argparse.Namespace, layout: Layout, plan, procs: Processes) -> tuple[str, dict]:
    """Start the coordinator and every site as processes, show the progress from the coordinator's log and wait
    for all of them: (the coordinator's JSON result, each site's JSON result).  A process that fails or runs
    past ``--timeout`` is one line (the failures the coordinator logged, or the tail of a log)."""
    total = plan.hyperparameters.total_rounds
    prog = Progress("demo", total, quiet=args.json, extra=f"{args.sites} sites, ε={plan.stated_epsilon:.3g}")
    failures: list[str] = []

    def on_event(rec: dict) -> None:
        if rec.get("event") == "status_page" and not args.json:
            log.info(f"live status page of the coordinator: {rec.get('url')}")
        if rec.get("event") == "tree":
            prog(int(rec.get("trees_released", 0)), total)
        elif rec.get("event") in ("session_failed", "model_mismatch"):
            failures.append(rec.get("msg", ""))

    if not args.json:
        log.info(f"starting the coordinator and {args.sites} sites (separate processes, mutual TLS) …")
    # Start everything at once (the sites retry until the coordinator serves): process start-up overlaps.
    address = f"127.0.0.1:{free_port()}"
    coord, ready = launch_coordinator(layout, procs, listen=address, extra=status_flags(args))
    keep: list[str] = []
    reader = follow_log(coord.stderr, on_event, keep, layout.logs / "coordinator.log")
    sites = {sid: start_site(layout, sid, address, plan, procs, ["--eval-data", str(layout.site_eval(sid))])
             for sid in plan.site_ids}
    ready()
    try:
        out, _ = coord.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise CliError(f"the federation did not finish within {args.timeout:g} s") from None
    reader.join(timeout=5)
    prog.close()
    if coord.returncode != 0:
        raise CliError(f"the coordinator failed (exit {coord.returncode}): "
                       + (" | ".join(failures) or _tail("".join(keep))))
    site_results = {}
    for sid, p in sites.items():
        try:
            sout, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise CliError(f"{sid} did not finish after the coordinator") from None
        if p.returncode != 0:
            raise CliError(f"{sid} failed (exit {p.returncode}): "
                           + _tail((layout.logs / f"{sid}.log").read_text()))
        site_results[sid] = json.loads(sout)
    return out, site_results


def _identical_models(layout: Layout, site_results: dict) -> bytes:
    """The coordinator's model file, after checking that every site wrote the very same bytes."""
    reference = (layout.coordinator / "model.json").read_bytes()
    for sid, res in site_results.items():
        if Path(res["model"]).read_bytes() != reference:
            raise CliError(f"{sid}'s model file differs from the coordinator's")
    return reference


def _emit_result(args: argparse.Namespace, plan, layout: Layout, federated: dict, reference: bytes, rows: int,
                 dropped: int, t0: float) -> None:
    """The demo's result: the pooled held-out metric beside the federated one, ε, the model's hash and the wall
    time since ``t0``."""
    from fedsbdt.common.auto import settings_text
    from fedsbdt.common.cli import evaluate_model
    from fedsbdt.common.data import load
    from fedsbdt.common.model import Ensemble

    model = Ensemble.load(layout.coordinator / "model.json")
    result = evaluate_model(model, load(layout.test_data, model.schema))
    secs = time.perf_counter() - t0
    sha = hashlib_sha256(reference)
    result.update({"epsilon": model.privacy["epsilon"], "epsilon_total": plan.total_epsilon,
                   "delta": model.privacy["delta"], "sites": args.sites,
                   "trees": len(model.trees), "dataset": args.dataset, "rows": rows, "dropped": dropped,
                   "model_sha256": sha, "seconds": round(secs, 3), "federated": federated,
                   "settings": args.settings, "hyperparameters": model.hyperparameters.to_dict()})
    metric = (f"rmse={result['rmse']:.4f}" if "rmse" in result
              else f"auc={result['auc']:.4f} accuracy={result['accuracy']:.4f}")
    metric = (f"{federated_text(federated)}\npooled for comparison (only a demo holds all held-out records; "
              f"exact, no privacy noise): {metric}; the federated value differs from it by the evaluation's "
              f"privacy noise (its 95 % interval) and its public clipping and bins")
    emit(args, result,
         f"federated S-BDT on {args.dataset}: {args.sites} sites (separate processes, mutual TLS, "
         f"secure aggregation, {plan.noise} noise), {len(model.trees)} trees, {_rows_text(rows, dropped)}\n"
         f"{args.settings} settings{' for these records (declared public)' if args.settings == 'auto' else ''}: "
         f"{settings_text(model.hyperparameters.to_dict())}\n"
         f"{metric} (n={result['n']})\n"
         f"privacy: {plan.budget_text()}, δ = {model.privacy['delta']:.3g}; every party wrote the identical "
         f"model (sha256 {sha[:16]}…)\n"
         f"wall time {secs:.1f} s")


def federated_text(receipt: dict) -> str:
    """The federated held-out metric, as the coordinator released it."""
    from fedsbdt.common.fed_eval import describe_receipt

    if "metrics" not in receipt:
        return f"federated held-out evaluation: {describe_receipt(receipt)}"
    return (f"held-out, evaluated federatedly (each site its own part; secure aggregation, ε_eval = "
            f"{receipt['epsilon_eval']:g} separate from training): {describe_receipt(receipt)}")


def _rows_text(rows: int, dropped: int) -> str:
    from fedsbdt.common.cli import dropped_text

    return f"{rows} training records{dropped_text(dropped)}"


def hashlib_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def status_flags(args: argparse.Namespace) -> list[str]:
    """The coordinator's ``--status-port``/``--status-host``/``--status-token-file`` (the demo's live status page)."""
    if args.status_port is None:
        return []
    token = ["--status-token-file", str(Path(args.status_token_file).resolve())] if args.status_token_file else []
    return ["--status-port", str(args.status_port), "--status-host", args.status_host, *token]


def register(sub) -> None:
    from fedsbdt.common.sources import add_source_flags
    from fedsbdt.common.statuspage import add_status_flags

    d = sub.add_parser("demo", help="a whole federation on loopback: coordinator and sites as processes, mutual TLS")
    d.add_argument("--sites", type=int, metavar="N",
                   help="number of sites, 2..20 (default: 3; with --split-by and no --sites, one per value)")
    d.add_argument("--dataset", choices=DATASETS, help="bundled dataset (default: abalone)")
    d.add_argument("--data", metavar="SOURCE",
                   help="your own CSV file (or a database URL with --query) instead of a bundled dataset (needs "
                        "--schema; 20 %% are held out for testing by a fixed public shuffle, the rest dealt to "
                        "the sites) (default: none: the bundled --dataset)")
    d.add_argument("--schema", metavar="FILE", help="the schema (TOML) of --data (required with --data)")
    d.add_argument("--split-by", metavar="COLUMN",
                   help="with --data: deal the rows to the sites by this column's value (e.g. a hospital "
                        "column; default: round-robin)")
    d.add_argument("--settings", choices=["auto", "paper"], default="auto",
                   help="auto (default): the settings fedsbdt train --rows N uses for the sites' training records "
                        "(docs/auto.md); paper: the S-BDT paper's defaults (T 100, depth 3, …). --trees and --depth "
                        "override either")
    d.add_argument("--trees", type=int, metavar="N", help="trees T_regular (default: from --settings)")
    d.add_argument("--depth", type=int, metavar="N", help="tree depth (default: from --settings)")
    d.add_argument("--epsilon", type=float, default=1.0, metavar="X", help="privacy budget ε (default: 1)")
    d.add_argument("--seed", type=int, metavar="N", help="public split seed (default: random)")
    d.add_argument("--eval-epsilon", type=float, default=1.0, metavar="X",
                   help="ε_eval of the federated held-out evaluation (default: 1, not the plan default 0.1: the "
                        "demo's held-out parts are small, e.g. ~280 Abalone records per site; "
                        "docs/federated-evaluation.md)")
    d.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="give up after this many seconds (default: 600)")
    d.add_argument("--workdir", metavar="DIR",
                   help="keep all files (CA, keys, plan, data, states, logs) in this directory (default: a "
                        "temporary directory, removed at the end)")
    d.add_argument("--keep-on-failure", action="store_true", help="keep the temporary directory if the demo fails")
    d.add_argument("--prepare", metavar="DIR",
                   help="only write CA, certificates, keys, plan and data splits to DIR (for docker compose) "
                        "(default: none: run the demo)")
    d.add_argument("--host", action="append", metavar="HOST",
                   help="with --prepare: host names of the coordinator for its certificate (default: localhost)")
    add_status_flags(d)
    add_source_flags(d)
    d.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    d.set_defaults(func=cmd_demo, on_interrupt="the sites and the coordinator were stopped; a demo does not "
                                               "resume: run it again")
