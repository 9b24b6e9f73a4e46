"""A whole federation in one process: the coordinator's :class:`~fedsbdt.server.session.Session` and N
:class:`~fedsbdt.client.site.SiteMachine`\\ s, connected without a transport (no gRPC, no TLS, no threads of
ours) and driven by a fake clock.

The state machines are the ones ``fedsbdt coordinator`` and ``fedsbdt client`` run: each site reads its own
file (parsed in a child process, as the daemon does), accepts the plan only after its own checks, draws its
Poisson subsample and its noise shares from its own randomness (the plan's: the OS-keyed CSPRNG unless the plan
says test randomness), masks its vectors by secure aggregation and checks every released tree; the coordinator
only ever sees masked inputs and their noisy sum.  What is left out is the network: every event is delivered in
order, every reply routed to the session method the gRPC servicer would call (as tests/federation/inproc.py
does for the tests).

Used by the federated audit (:mod:`fedsbdt.federated_audit`, ``fedsbdt audit --sites N``) and the
reconstruction benchmark (benchmarks/reconstruction.py): both need the model a real federation releases,
trained on data they hold in memory.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.client.policy import SitePolicy
from fedsbdt.client.site import NeedCatchUp, SiteMachine, SiteOptions
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import Dataset
from fedsbdt.common.federation.plan import Deadlines, Plan, SiteEntry, make_plan
from fedsbdt.common.federation.wire import Done, InputReply, Refusal, RoundReply, SetupReply
from fedsbdt.common.model import Ensemble

from fedsbdt.server.session import Rejected, Session

#: steps of the event loop after which a session that has not finished is declared stuck
MAX_STEPS = 10_000_000


def catch_up_site(session: Session, machine: SiteMachine) -> None:
    """The site applies every released tree it lacks, as the servicer's CatchUp pages them (1,000 at a time)."""
    while True:
        init, has_init, trees = session.catch_up(machine.trees_applied, 1000)
        machine.apply_catch_up(init, has_init, trees)
        if not trees:
            return


def site_replies(session: Session, machine: SiteMachine, ev) -> list:
    """``machine``'s replies to the coordinator's event ``ev``, after catching it up if it is behind."""
    try:
        return machine.handle(ev)
    except NeedCatchUp:
        catch_up_site(session, machine)
        return machine.handle(ev)


def join_site(session: Session, sid: str, machine: SiteMachine, now: float, deliver: Callable) -> bytes:
    """A site joins as the service lets it: Join, catch up, report progress, subscribe; each step's events go to
    ``deliver``.  Returns the stream token."""
    token, outs = session.join(sid, machine.trees_applied, now)
    deliver(outs)
    catch_up_site(session, machine)
    deliver(session.report_progress(sid, machine.trees_applied, now))
    deliver(session.subscribed(sid, token, now))
    return token


def route_reply(session: Session, sid: str, reply, now: float, refusals: list[tuple[str, str]]) -> list:
    """Hand a site's reply to the session method the gRPC servicer would call; returns the events to deliver.
    A refusal is also noted in ``refusals``; a reply the session rejects raises :class:`Rejected`."""
    if isinstance(reply, SetupReply):
        return session.submit_setup(sid, reply.secagg, now)
    if isinstance(reply, InputReply):
        return session.submit_input(sid, reply.purpose, reply.tree, reply.secagg, now)
    if isinstance(reply, RoundReply):
        return session.submit_round(sid, reply.secagg, now)
    if isinstance(reply, Refusal):
        refusals.append((sid, reply.detail))
        return session.report_refusal(sid, reply.detail, now, reply.round_id)
    if isinstance(reply, Done):
        return session.report_finished(sid, reply.model_sha256, now)
    return []


class InProcessError(RuntimeError):
    """The in-process federation did not release a model (a site refused, or the session aborted)."""


@dataclass(frozen=True)
class InProcessSetup:
    """How the in-process federation is run (the plan's session settings a test or an audit chooses).

    ``noise_factor`` is TEST-ONLY (the federated audit's negative control and planted bug): every site's leaf
    noise share (and, central noise, the coordinator's noise) is multiplied by it; the plan, and so the model's
    receipt, still state the claimed ε.  No command line flag, plan key or environment variable sets it.
    """

    noise: str = "distributed"  # the plan's noise mode: "distributed" (each site adds a share) or "central"
    randomness: str = "secure"  # "secure" (OS CSPRNG), or "insecure-test" (deterministic, no privacy)
    sampler: str = "ours"  # the exact noise sampler of secure randomness (the plan's session.sampler)
    test_seed: int = 0  # insecure-test only
    test_noise: bool = True  # insecure-test only: False releases exact sums
    noise_factor: float = 1.0
    site_prefix: str = "site"
    quiet: bool = True  # the coordinator's and the sites' INFO lines held back while the federation runs

    def __post_init__(self) -> None:
        if self.noise not in ("distributed", "central"):
            raise ConfigError(f"noise = {self.noise!r}: must be 'distributed' or 'central'")
        if self.randomness not in ("secure", "insecure-test"):
            raise ConfigError(f"randomness = {self.randomness!r}: must be 'secure' or 'insecure-test'")
        f = self.noise_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 <= f <= 1:
            raise ConfigError("the test-only noise factor must be in [0, 1]")
        if not self.site_prefix or not self.site_prefix.replace("-", "").isalnum():
            raise ConfigError(f"site_prefix = {self.site_prefix!r}: letters, digits and '-' only")


def write_site_file(ds: Dataset, path: Path) -> Path:
    """``ds`` as a Parquet file its schema parses back to the same arrays (numbers exact, categorical features as
    their level names, missing values as nulls, class labels as the schema's label strings)."""
    import pandas as pd

    schema = ds.schema
    cols = {}
    for j, f in enumerate(schema.features):
        x = ds.X[:, j]
        if f.is_categorical:
            cols[f.name] = pd.Series([None if math.isnan(v) else f.levels[int(v)] for v in x], dtype=object)
        else:
            cols[f.name] = pd.Series(x, dtype="float64")
    frame = pd.DataFrame(cols)
    if schema.task == "multiclass":
        frame[schema.target] = [schema.classes[int(v)] for v in ds.y]
    elif schema.task == "binary":
        frame[schema.target] = np.where(np.asarray(ds.y) == 1, schema.positive[0], schema.negative[0]).astype(object)
    else:
        frame[schema.target] = np.asarray(ds.y, dtype=np.float64)
    if schema.id_column is not None:
        frame[schema.id_column] = ds.ids
    if schema.arrival_column is not None:
        frame[schema.arrival_column] = np.zeros(ds.n, np.int64) if ds.arrival is None else ds.arrival
    frame.to_parquet(path, index=False)
    return path


@dataclass
class InProcessFederation:
    """The coordinator's session and the sites' machines of one plan, joined; :meth:`run` trains."""

    plan: Plan
    session: Session
    machines: dict[str, SiteMachine]
    clock: float = 1000.0
    queues: dict[str, deque] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    refusals: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def create(cls, datasets: Sequence[Dataset], hp: Hyperparameters, workdir: str | Path,
               setup: InProcessSetup = InProcessSetup()) -> "InProcessFederation":
        """One site per dataset (written to ``workdir``), identity keys made here, a plan of ``hp`` with the
        roster pinning them, the sites' policies accepting exactly that plan."""
        if len(datasets) < 2:
            raise ConfigError(f"a federation needs at least 2 sites, got {len(datasets)}")
        schema = datasets[0].schema
        if any(d.schema.digest() != schema.digest() for d in datasets):
            raise ConfigError("every site's data must follow the same schema")
        workdir = Path(workdir)
        ids = [f"{setup.site_prefix}-{k + 1}" for k in range(len(datasets))]
        keys = {s: Ed25519PrivateKey.generate() for s in ids}
        session_kw = dict(noise=setup.noise, randomness=setup.randomness, sampler=setup.sampler,
                          max_records_per_site=max(d.n for d in datasets),
                          deadlines=Deadlines(join=3600.0, stage=3600.0, quorum=36_000.0, finish=3600.0))
        if setup.randomness == "insecure-test":
            session_kw.update(test_seed=setup.test_seed, test_noise=setup.test_noise)
        plan = make_plan(schema, hp, [SiteEntry(s, keys[s].public_key().public_bytes_raw()) for s in ids],
                         **session_kw)
        policy = SitePolicy(allow_central_noise=setup.noise == "central", min_sites=2,
                            lifetime_epsilon=max(10.0, 2.0 * float(plan.stated_epsilon)))
        options = SiteOptions(expected_plan_sha256=plan.sha256,
                              allow_insecure_test_randomness=setup.randomness == "insecure-test", policy=policy,
                              audit_noise_factor=float(setup.noise_factor))
        randomness = plan.make_randomness(setup.randomness == "insecure-test")
        if setup.noise_factor != 1.0:
            from fedsbdt.common.audit import ScaledNoise

            randomness = ScaledNoise(randomness, setup.noise_factor)
        machines = {s: SiteMachine(s, keys[s], write_site_file(d, workdir / f"{s}.parquet"), workdir / f"state-{s}",
                                   options) for s, d in zip(ids, datasets)}
        # each site parses its file and draws its first noise block in child processes: let them overlap
        with ThreadPoolExecutor(max_workers=len(ids)) as pool:
            for f in [pool.submit(m.accept_plan, plan.canonical_json, plan.sha256) for m in machines.values()]:
                f.result()
        fed = cls(plan, Session(plan, randomness, 1000.0), machines)
        for s in ids:
            fed.join(s)
        return fed

    # ------------------------------------------------------------------ the transport

    def deliver(self, outs) -> None:
        for sid, ev in outs:
            if sid in self.queues:
                self.queues[sid].append(ev)

    def join(self, sid: str) -> None:
        self.queues[sid] = deque()
        join_site(self.session, sid, self.machines[sid], self.clock, self.deliver)

    def route(self, sid: str, reply) -> None:
        try:
            self.deliver(route_reply(self.session, sid, reply, self.clock, self.refusals))
        except Rejected as e:
            self.rejected.append((sid, str(e)))

    def step(self) -> bool:
        """One event to each site with a non-empty queue; False when nothing was pending."""
        busy = False
        for sid in sorted(self.queues):
            q = self.queues[sid]
            if not q:
                continue
            busy = True
            ev = q.popleft()
            for r in site_replies(self.session, self.machines[sid], ev):
                self.route(sid, r)
        return busy

    def run(self, progress: Callable[[int, int], None] | None = None) -> Ensemble:
        """Run the session to its end; the released model (raises :class:`InProcessError` without one)."""
        total = self.plan.hyperparameters.total_rounds
        released = -1
        try:
            for _ in range(MAX_STEPS):
                if self.session.done:
                    break
                if not self.step():
                    self.clock += 1.0
                    self.deliver(self.session.tick(self.clock))
                if progress is not None and len(self.session.trees) != released:
                    released = len(self.session.trees)
                    progress(released, total)
            else:
                raise InProcessError("the in-process federation did not settle")
            if self.session.exit_code != 0 or self.session.model_json is None:
                why = "; ".join(f"{s}: {d}" for s, d in (self.refusals + self.rejected)[:3]) or "no detail"
                raise InProcessError(f"the federation released no model ({why})")
            return Ensemble.from_dict(json.loads(self.session.model_json), source="the federation's model")
        finally:
            self.close()

    def close(self) -> None:
        for m in self.machines.values():
            m.close()
        self.session.close()


def train_in_process(datasets: Sequence[Dataset], hp: Hyperparameters, setup: InProcessSetup = InProcessSetup(),
                     progress: Callable[[int, int], None] | None = None,
                     workdir: str | Path | None = None) -> Ensemble:
    """Train ``hp`` by a federation of one site per dataset (:class:`InProcessFederation`); the released model.

    The sites' files, ledgers and state live in ``workdir`` (a temporary directory, removed afterwards, when
    none is given)."""
    with _quiet(setup.quiet), contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="fedsbdt-inprocess-"))
        return InProcessFederation.create(datasets, hp, workdir, setup).run(progress)


#: the loggers of the coordinator and the sites, whose per-round INFO lines a caller of train_in_process (an audit,
#: a benchmark) does not want: with ``quiet`` they log warnings and errors only while the federation runs
FEDERATION_LOGGERS = ("fedsbdt.coordinator", "fedsbdt.site")


@contextlib.contextmanager
def _quiet(quiet: bool):
    loggers = [logging.getLogger(n) for n in FEDERATION_LOGGERS] if quiet else []
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)
