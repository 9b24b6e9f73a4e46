"""A site's side of a federated session: a transport-free state machine.

Stages (one class each)::

    AwaitingPlan ──accept_plan()──▶ Participating ──Finished event──▶ Done
          │                              └──Aborted event / coordinator lies──▶ Aborted
          └──(any check fails: SiteRefusal, nothing joined)

``accept_plan`` is where a site decides whether to take part at all.  It
refuses (raising :class:`SiteRefusal` with one clear sentence) when the
served plan's hash is not the one it was given out of band (or none was
given), its roster does not pin this site's identity key, its privacy
statement (σ, ε) does not match the site's own accountant, ε exceeds the
site's ``--max-epsilon``, it breaks the site's policy (central noise without
``--allow-central-noise``; fewer sites, a lower threshold or fewer assumed
colluders than ``--min-sites/--min-threshold/--min-colluders``), the
schema differs from the site's local schema, the local data does not match
the schema or exceeds the plan's public record bound, or the plan uses
test-only randomness without ``--allow-insecure-test-randomness``.

While participating, :meth:`SiteMachine.handle` takes one coordinator event
and returns the replies to send.  The privacy rules it enforces (see
docs/federation.md):

* the initial score is contributed **once**: the noisy vector is stored with
  the first masked input and a retried round gets the identical vector;
* central noise: a site's *un-noised* vector enters at most one attempt of a
  logical round (the initial score, or tree k).  Every later attempt carries a
  full noise share of its own — for the initial score one discrete-Laplace
  vector drawn at the first retry and stored (every retry resends it, so
  retries cannot be averaged), for a tree a fresh discrete Gaussian of the
  whole leaf-noise scale — so a coordinator that withholds a result and
  retries with fewer sites learns a difference that is noised, never a
  site's exact sums (docs/threat-model.md "Retries");
* without the filter, at most ``T_regular + T_extra`` tree rounds carry data —
  every masked input counts, retries included; beyond that the site sends an
  all-zero data vector (plus its noise share);
* with the filter, the per-record ledger bounds every record;
* the ledger update, the contribution log and secagg's "input sent" record
  commit in one transaction *before* the masked vector is returned;
* a RoundStart for a tree this site has not caught up to (or has already
  seen released) is refused; secure aggregation refuses participant sets
  without this site or smaller than t, and range-checks the site's input;
* distributed noise: a tree round's share has variance σ²/k_r with
  k_r = max(t, |P_r| − s) − c recomputed from the plan and the RoundStart's
  participant set, and the site signs the survivor set U3 only if
  |U3| − c ≥ k_r (otherwise the round is aborted at this site).

* fast rounds (plan ``[secure_aggregation] fast_path``, docs/federation.md §10): a
  site answers a FastRoundStart with one reply (its masked input and its seed
  shares of every participant), charged exactly as a masked input, unless the
  pinned plan says ``"never"`` or uses the sparse graph (then it refuses it);
  secure aggregation then refuses that round's consistency and unmask requests.

* federated evaluation (plan ``[evaluation]``): after every tree is applied,
  the site sends the histogram of the model's predictions on its held-out
  file plus a full discrete-Gaussian share at ε_eval, drawn once and resent
  unchanged on retries (client/evaluation.py); an evaluation request the
  pinned plan does not declare, of another vector length or before the last
  tree is refused.

The rounds of the plan's trees are driven by the gate (client/gate.py
``Gate.tree_round``: attempt → admit → compute → noise → charge → send); the
plan's mode (``mode_for(plan).site_rounds(ctx)``, common/modes/site_rounds.py)
only checks a request, declares which records its release reads and computes
the vector from the records the gate admitted.  Every noise share, of every
release kind, is drawn by one rule (client/noise.py ``draw_share``).  This
module never asks which mode it is.  Every released tree is checked by the mode
(the plan's public splits, or the splits its requests carried) before it is
applied; a coordinator that sends anything else is caught.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.common import kernels_numpy
from fedsbdt.common.boosting import split_edges
from fedsbdt.common.multiclass import init_vector_len, round_vector_len
from fedsbdt.common.multiclass_boosting import local_data_for
from fedsbdt.common.config import ConfigError
from fedsbdt.common.data import DataError
from fedsbdt.common.engine import filter_for
from fedsbdt.common.fixedpoint import FixedPointError
from fedsbdt.common.lifetime import record_source
from fedsbdt.common.schema import Schema
from fedsbdt.common.secagg import ProtocolAbort, RoundStart, SecAggSite, decode_message
from fedsbdt.common.secagg.errors import InvalidMessage
from fedsbdt.common.secagg.primitives import ed25519_public
from fedsbdt.common.splits import random_splits
from fedsbdt.common.federation.accounting import verify_privacy
from fedsbdt.common.federation.plan import Plan, PlanError
from fedsbdt.common.randomness import plan_randomness
from fedsbdt.common.federation.release import build_model, evaluation_receipt, model_bytes, model_content_sha256
from fedsbdt.common.federation.wire import (
    NONCE_BYTES,
    AbortedMsg,
    Done,
    Event,
    FinishedMsg,
    InitScoreMsg,
    InputReply,
    Purpose,
    Refusal,
    Reply,
    RoundMsg,
    RoundReply,
    RoundStartMsg,
    SetupMsg,
    SetupReply,
    TreeMsg,
    sign_join,
)

from .dataload import as_source, load_isolated
from .evaluation import check_request, eval_input, load_held_out
from .gate import Gate, LeaveSession, ModeStoreView
from fedsbdt.common.modes import mode_for
from fedsbdt.common.modes.site_rounds import NeedCatchUp, SiteContext
from .ledger import LedgerError, SiteLedger, ledger_path
from .isolated_noise import IsolatedSampler
from .noise import NoiseShares, draw_share, isolated_shares
from .policy import MAX_EVAL_EPSILON, SitePolicy

log = logging.getLogger("fedsbdt.site")


class SiteRefusal(ConfigError):
    """The site refuses to take part in the session (the reason is one clear sentence)."""


class SessionAbort(RuntimeError):
    """The session cannot continue for this site (the coordinator aborted it or sent something false)."""


def model_path(state_dir: str | os.PathLike, plan_sha256: str) -> Path:
    """Where a site writes a plan's verified model without ``--out``: ``<state>/model-<first 16 hex digits of the
    plan hash>.json``, beside that plan's ledger, so that the next plan in the same state directory does not
    overwrite it."""
    return Path(state_dir) / f"model-{plan_sha256[:16]}.json"


@dataclass(frozen=True)
class SiteOptions:
    max_epsilon: float | None = None
    expected_plan_sha256: str | None = None  # from --plan-hash or the hash of --plan (required by accept_plan)
    local_schema: Schema | None = None  # from --schema
    allow_insecure_test_randomness: bool = False
    model_out: Path | None = None  # default: <state>/model-<plan hash prefix>.json (model_path)
    policy: SitePolicy = SitePolicy()  # central-noise opt-in, smallest roster, threshold, colluders
    eval_data: Path | None = None  # --eval-data: held-out file for the plan's federated evaluation
    max_eval_epsilon: float | None = MAX_EVAL_EPSILON  # --max-eval-epsilon: refuse a plan whose ε_eval exceeds this
    #: TEST-ONLY, never a flag: this site's leaf noise × the factor (the federated audit's negative control and
    #: planted bug, fedsbdt.federated_audit); 1.0 everywhere else
    audit_noise_factor: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.audit_noise_factor, bool) or not 0 <= self.audit_noise_factor <= 1:
            raise ConfigError("the test-only noise factor must be in [0, 1]")
        if self.max_epsilon is not None and not self.max_epsilon > 0:
            raise ConfigError("--max-epsilon must be > 0")
        if self.max_eval_epsilon is not None and not self.max_eval_epsilon > 0:
            raise ConfigError("--max-eval-epsilon must be > 0")


# =========================================================================== stages


class SiteStage:
    name = "site"


class AwaitingPlan(SiteStage):
    name = "awaiting-plan"


@dataclass
class Participating(SiteStage):
    name = "participating"


@dataclass
class SiteDone(SiteStage):
    model_sha256: str
    model_path: Path
    name = "done"


@dataclass
class SiteAborted(SiteStage):
    reason: str
    name = "aborted"


# =========================================================================== the machine


class SiteMachine:
    """One site in one session.

    Args:
        site_id: this site's id (must be in the plan's roster).
        identity_key: the site's Ed25519 identity private key (its public key is pinned in the plan).
        data_path: the site's private data file (CSV/Parquet as described by the plan's schema).
        state_dir: where the site database and the final model are kept.
        options: the site's own policy (ε cap, expected plan hash, local schema, test randomness).
    """

    def __init__(self, site_id: str, identity_key: Ed25519PrivateKey, data_path: str | os.PathLike,
                 state_dir: str | os.PathLike, options: SiteOptions = SiteOptions()) -> None:
        self.site_id = site_id
        self.identity_key = identity_key
        self.data_path = None if data_path is None else as_source(data_path)  # None: evaluation-only plans
        self.state_dir = Path(state_dir)
        self.options = options
        self.stage: SiteStage = AwaitingPlan()
        self.plan: Plan | None = None
        self.init: InitScoreMsg | None = None
        self.trees: list[TreeMsg] = []
        self._leaf_cache: dict[int, np.ndarray] = {}
        self.cpu_at_first_tree: float | None = None  # process CPU time when the first tree was applied
        #: the released federated evaluation as this site recomputed it from the coordinator's Finished (the
        #: receipt written next to the model as ``<model>.evaluation.json``), ``{"failed": why}``, or None
        self.evaluation_released: dict | None = None

    # ------------------------------------------------------------------ views

    @property
    def trees_applied(self) -> int:
        return len(self.trees)

    @property
    def finished(self) -> bool:
        return isinstance(self.stage, (SiteDone, SiteAborted))

    # ------------------------------------------------------------------ the plan

    def accept_plan(self, plan_json: bytes, served_sha256: str) -> Plan:
        """Check the served plan against this site's policy and data; prepare to participate.

        Stages, in order (each refuses with :class:`SiteRefusal`, and nothing is joined or written before the
        last check passed): the served plan is the pinned one (:meth:`_pinned_plan`); its privacy statement is
        this site's accountant's (:meth:`_verified_privacy`); it fits this site's policy (:meth:`_check_policy`);
        the local data fits it (:meth:`_load_data`); the lifetime accounts allow it and are opened
        (:meth:`_open_accounts`); then the site prepares its rounds (:meth:`_prepare_rounds`)."""
        if not isinstance(self.stage, AwaitingPlan):
            raise SiteRefusal("a plan was already accepted")
        plan = self._pinned_plan(plan_json, served_sha256)
        randomness, cal = self._verified_privacy(plan)
        gate = Gate(plan, self.options.policy, None, self.state_dir, self.site_id)
        self._check_policy(plan, gate, cal)
        ds = self._load_data(plan)
        self._open_accounts(plan, gate, cal, ds)
        self._prepare_rounds(plan, gate, ds, randomness, cal)
        if plan.noise == "central":
            log.warning(f"{self.site_id}: central noise mode: the coordinator sees this site's noiseless sums "
                        "(summed with the others') and must be trusted to add the noise",
                        extra={"event": "central_noise", "site": self.site_id})
        self.stage = Participating()
        log.info(f"{self.site_id}: accepted plan {plan.sha256[:16]}… ({ds.n} records, {plan.budget_text()}, "
                 f"noise {plan.noise})", extra={"event": "plan_accepted", "site": self.site_id, "records": ds.n,
                                                "epsilon": cal.epsilon, "epsilon_total": plan.total_epsilon})
        return plan

    def _pinned_plan(self, plan_json: bytes, served_sha256: str) -> Plan:
        """The served plan, if it is the one its hash announces, the one pinned out of band, and its roster pins
        this site's identity key."""
        actual = hashlib.sha256(plan_json).hexdigest()
        if actual != served_sha256:
            raise SiteRefusal(f"the coordinator's plan does not match the hash it announces ({actual} ≠ "
                              f"{served_sha256})")
        try:
            plan = Plan.from_canonical_json(plan_json, source="served plan")
        except PlanError as e:
            raise SiteRefusal(f"the coordinator serves an invalid plan: {e}") from None
        expected = self.options.expected_plan_sha256
        if expected is None:
            raise SiteRefusal("no plan was pinned out of band (--plan or --plan-hash); refusing to take part in "
                              "whatever plan the coordinator serves")
        if expected.lower() != plan.sha256:
            raise SiteRefusal(f"plan hash mismatch: the coordinator serves plan {plan.sha256}, but this site was "
                              f"given {expected.lower()} out of band; refusing to take part")
        pinned = plan.identity_key(self.site_id)
        if pinned is None:
            raise SiteRefusal(f"site {self.site_id!r} is not in the plan's roster ({', '.join(plan.site_ids)})")
        if pinned != ed25519_public(self.identity_key):
            raise SiteRefusal(f"the plan pins another identity key for {self.site_id!r} than this site's "
                              "identity key; check --identity-key / the roster")
        return plan

    def _verified_privacy(self, plan: Plan):
        """(the plan's DP randomness, its calibration recomputed by this site's accountant)."""
        try:
            randomness = plan_randomness(plan, self.options.allow_insecure_test_randomness)
            # exact noise drawn in child processes, so the daemon never loads numba, where the mode draws its
            # shares ahead (modes that draw a share per level on demand sample in-process)
            if not getattr(randomness, "insecure", False) and mode_for(plan).isolated_sampler:
                randomness = IsolatedSampler(randomness)
            if self.options.audit_noise_factor != 1.0:  # TEST-ONLY (see SiteOptions)
                from .audit_noise import scaled_noise

                randomness = scaled_noise(randomness, self.options.audit_noise_factor)
            cal = verify_privacy(plan)  # this site's accountant (common/federation/accounting.py)
        except PlanError as e:
            raise SiteRefusal(str(e)) from None
        return randomness, cal

    def _check_policy(self, plan: Plan, gate: Gate, cal) -> None:
        """The site's caps (before the data is read; the lifetime cap once it is), its policy, its schema, and
        what an evaluation-only plan needs."""
        opts = self.options
        refusal = gate.admission_refusal(cal.epsilon, opts.max_epsilon, opts.max_eval_epsilon, {}) \
            or opts.policy.refusal(plan)
        if refusal is not None:
            raise SiteRefusal(refusal)
        local = opts.local_schema
        if local is not None and local.digest() != plan.schema.digest():
            raise SiteRefusal(f"schema mismatch: the local schema (digest {local.digest()[:16]}…) differs from the "
                              f"plan's schema (digest {plan.schema.digest()[:16]}…)")
        if self.data_path is None and (plan.eval_model_sha256 is None or opts.eval_data is None):
            raise SiteRefusal("no training data (--data): only a plan that evaluates an existing model "
                              "(evaluation.model_sha256) can be joined with --eval-data alone")
        if plan.eval_model_sha256 is not None and plan.eval_model_content_sha256 is None:
            raise SiteRefusal("the plan evaluates an existing model but pins only its file hash, not the digest of "
                              "its trees (evaluation.model_content_sha256): this site could not check the model it "
                              "evaluates; re-create the plan with `fedsbdt plan --evaluate-model`")

    def _load_data(self, plan: Plan):
        """The local data, parsed with the plan's schema in a child process, within the plan's record bound."""
        try:  # evaluation-only plans train nothing: the held-out file stands in for the (unused) training data
            ds = load_isolated(self.data_path or self.options.eval_data, plan.schema)  # parsed in a child
        except DataError as e:
            raise SiteRefusal(f"the local data does not match the plan's schema: {e}") from None
        if ds.n > plan.max_records_per_site:
            raise SiteRefusal(f"{self.data_path} holds {ds.n} records, more than the plan's public bound "
                              f"max_records_per_site = {plan.max_records_per_site}")
        return ds

    def _open_accounts(self, plan: Plan, gate: Gate, cal, ds) -> None:
        """The held-out data; the lifetime cap on the record sets the plan reads; the plan's ledger; the gate."""
        self.held_out = self._accept_evaluation(plan)
        sources = {}  # the records the plan's releases read (the lifetime ledger's record sets, with provenance)
        if gate.mode.trains(plan) and self.data_path is not None:
            sources["train"] = record_source(self.data_path, ds.ids, plan.schema.id_column)
        if self.held_out is not None:
            sources["eval"] = record_source(self.options.eval_data, self.held_out.ids, plan.schema.id_column)
        refusal = gate.admission_refusal(cal.epsilon, None, None, sources)
        if refusal is not None:
            raise SiteRefusal(refusal)
        try:
            self.ledger = SiteLedger(ledger_path(self.state_dir, plan.sha256), plan.sha256, self.site_id)
        except LedgerError as e:
            raise SiteRefusal(str(e)) from None
        gate.ledger = self.ledger
        gate.open(sources)
        self.gate = gate

    def _prepare_rounds(self, plan: Plan, gate: Gate, ds, randomness, cal) -> None:
        """The local model state, secure aggregation, the mode's tree rounds and the noise shares drawn ahead."""
        hp = plan.hyperparameters
        self.local = local_data_for(plan.schema, ds.X, ds.y, ds.ids, hp, ds.arrival,
                                    edges=split_edges(plan.schema, hp.split_candidates), backend=kernels_numpy)
        self.ledger.ensure_records(ds.ids)
        self.local.spent = self.ledger.spent_for(ds.ids)
        self.secagg = SecAggSite(plan.secagg_config(), self.site_id, self.identity_key, self.ledger.storage,
                                 min_survivors=self._min_survivors if plan.noise == "distributed" else None,
                                 allow_fast=plan.secagg_fast_path != "never")  # sparse: fast-only sessions only (secagg)
        self.randomness, self.cal, self.table = randomness, cal, filter_for(hp, cal)
        self.leaf_scales, self.init_scales = plan.noise_scales()
        self.plan = plan
        self.noise = self._init_share = None
        # the mode's tree rounds (common/modes/site_rounds.py), handed exactly what a mode may read
        self.rounds = gate.mode.site_rounds(SiteContext(plan, self.local, randomness, self.table,
                                                        ModeStoreView(self.ledger), self.abort))
        if hp.init_share == 0:
            self._set_init(InitScoreMsg(0.0, None, ()))
        self._warm_up()
        if self.leaf_scales is not None and self.rounds.leaf_shares_ahead:  # one scale vector per divisor k_r
            ks = sorted({plan.noise_divisor(p) for p in range(plan.threshold, plan.n + 1)})
            scales, expect = {k: plan.leaf_share_scales(k) for k in ks}, plan.noise_divisor(plan.n)
            if isinstance(randomness, IsolatedSampler):  # one child draws the first block and the initial share
                self.noise, self._init_share = isolated_shares(randomness, scales, expect, hp.accounted_rounds,
                                                               self.init_scales)
            else:
                self.noise = NoiseShares(randomness, scales, expect=expect)

    def _accept_evaluation(self, plan: Plan):
        """The plan's federated evaluation against this site's policy; the held-out data (or None)."""
        spec, path = plan.eval_spec, self.options.eval_data
        if spec is None:
            if path is not None:
                log.warning(f"{self.site_id}: --eval-data given, but the plan declares no federated evaluation; "
                            "the held-out file is not used", extra={"event": "eval_unused", "site": self.site_id})
            return None
        if path is None:
            log.warning(f"{self.site_id}: the plan evaluates the model, but this site has no --eval-data: it will "
                        "add only its noise share", extra={"event": "no_eval_data", "site": self.site_id})
            return None
        try:
            return load_held_out(path, plan)
        except ValueError as e:
            raise SiteRefusal(str(e)) from None

    def _warm_up(self) -> None:
        """Compile the kernels and build the noise samplers now, not in the first round (deadlines).

        The contribution is computed and discarded: nothing is charged, stored or sent, and the
        subsample it draws is thrown away.  Noise is drawn and discarded only from the secure source
        (the deterministic test source must stay in step with a centralised run).
        """
        hp = self.plan.hyperparameters
        splits = random_splits(self.plan.schema, hp.depth, hp.seed, 0, hp.cyclical, hp.split_candidates)
        c = self.local.contribution(splits, 0, self.randomness, self.table)
        if self.local.pred.ndim == 1:
            self.local.kernels.apply_leaves(self.local.pred.copy(), c.leaf, np.zeros(hp.leaves), hp.learning_rate)
        if not getattr(self.randomness, "insecure", False) and not isinstance(self.randomness, IsolatedSampler):
            for scales, draw in ((self.leaf_scales, self.randomness.discrete_gaussian),
                                 (self.init_scales, self.randomness.discrete_laplace)):
                if scales is not None:
                    draw(scales)

    def _min_survivors(self, start: RoundStart) -> int:
        """The smallest survivor set this site signs (distributed noise): k_r + c for a tree round.

        k_r = max(t, |P_r| − s) − c is recomputed here from the public plan and the participant set
        of the round's RoundStart (stored by secure aggregation, so a restarted site applies the same
        rule); no number from the coordinator is trusted.  Every site in U3 added a share of variance
        σ²/k_r, at most c of them collude, so a sum over U3 holds ≥ (|U3| − c)·σ²/k_r ≥ σ² honest noise.
        The initial-score round (vector length 2; each site adds a full Laplace share) needs only t.
        """
        plan = self.plan
        p = len(start.participants)
        if start.vector_len == init_vector_len(plan.schema) or not plan.threshold <= p <= plan.n:
            return plan.threshold  # secure aggregation refuses impossible participant sets itself
        return plan.min_survivors(p)

    def join_material(self) -> tuple[bytes, bytes]:
        """(nonce, signature) for a Join: the identity key signs plan hash, site id and a fresh nonce."""
        assert self.plan is not None
        nonce = os.urandom(NONCE_BYTES)
        return nonce, sign_join(self.identity_key, self.plan.sha256, self.site_id, nonce)

    # ------------------------------------------------------------------ catch-up

    def apply_catch_up(self, init: InitScoreMsg | None, has_init: bool, trees: list[TreeMsg]) -> None:
        """Apply a page of released trees (GetTrees) in order; already applied ones are checked and skipped."""
        if has_init and self.init is None and init is not None:
            self._set_init(init)
        for t in trees:
            if t.index < len(self.trees):
                if t != self.trees[t.index]:
                    raise self._abort(f"the coordinator now serves a different tree {t.index} than it released")
                continue
            if t.index > len(self.trees):
                raise self._abort(f"catch-up skipped from tree {len(self.trees)} to {t.index}")
            self._apply_tree(t)

    # ------------------------------------------------------------------ events

    def handle(self, ev: Event) -> list[Reply]:
        """Process one coordinator event; returns the replies to send (already persisted where needed)."""
        if not isinstance(self.stage, Participating):
            return []
        if isinstance(ev, SetupMsg):
            return self._secagg_step(ev.secagg, SetupReply)
        if isinstance(ev, RoundStartMsg):
            return self._round_start(ev)
        if isinstance(ev, RoundMsg):
            return self._secagg_step(ev.secagg, RoundReply)
        if isinstance(ev, InitScoreMsg):
            if self.init is None:
                self._set_init(ev)
            elif ev != self.init:
                raise self._abort("the coordinator released a second, different initial score")
            return []
        if isinstance(ev, TreeMsg):
            if ev.index < len(self.trees):
                if ev != self.trees[ev.index]:
                    raise self._abort(f"the coordinator released tree {ev.index} twice with different content")
                return []
            if ev.index > len(self.trees) or self.init is None:
                raise NeedCatchUp(len(self.trees), ev.index)
            self._apply_tree(ev)
            return []
        if isinstance(ev, FinishedMsg):
            return self._finish(ev)
        if isinstance(ev, AbortedMsg):
            self.close()
            self.stage = SiteAborted(f"the coordinator aborted the session: {ev.reason}")
            log.error(f"{self.site_id}: {self.stage.reason}", extra={"event": "aborted", "site": self.site_id})
            return []
        raise TypeError(f"not an event: {type(ev).__name__}")  # pragma: no cover

    # ------------------------------------------------------------------ secure aggregation

    def _secagg_step(self, data: bytes, reply_type) -> list[Reply]:
        try:
            msg = decode_message(data)
        except InvalidMessage as e:
            return [Refusal(f"malformed secure-aggregation message: {e}")]
        r = getattr(msg, "round_id", None)
        with self.ledger.transaction():
            try:
                reply = self.secagg.handle(msg)
            except ProtocolAbort as e:  # persisted by secagg (commits with this transaction)
                log.warning(f"{self.site_id}: secure aggregation aborted: {e}",
                            extra={"event": "secagg_abort", "site": self.site_id})
                return [Refusal(f"secure aggregation aborted: {e}", r)]
            except InvalidMessage as e:
                return [Refusal(f"{type(msg).__name__} refused: {e}", r)]
        return [] if reply is None else [reply_type(reply.to_bytes())]

    def _round_start(self, ev: RoundStartMsg) -> list[Reply]:
        try:
            start = RoundStart.from_bytes(ev.secagg)
        except InvalidMessage as e:
            return [Refusal(f"malformed RoundStart: {e}")]
        r = start.round_id
        bad = self.gate.refusal(ev.purpose, ev.tree, ev.level)  # the pinned plan's schedule, before anything else
        if bad is not None:
            return [Refusal(f"round {r}: {bad}", r)]
        try:
            return self._scheduled_round_start(ev, start)
        except LeaveSession as e:
            raise self._abort(str(e)) from None

    def _scheduled_round_start(self, ev: RoundStartMsg, start: RoundStart) -> list[Reply]:
        if ev.purpose == Purpose.EVAL:
            return self._eval_round_start(ev, start)
        if ev.purpose != Purpose.INIT_SCORE:  # the gate drives the plan's mode (common/modes/site_rounds.py)
            return self.gate.tree_round(self.rounds, self, ev, start)
        return self._init_round_start(ev, start)

    def _init_round_start(self, ev: RoundStartMsg, start: RoundStart) -> list[Reply]:
        """The initial score: contributed once; a retry resends the stored vector (central noise: with a full
        noise share drawn at the first retry and stored)."""
        plan, local, r = self.plan, self.local, start.round_id
        settled = self.settled_input(ev, start, init_vector_len(plan.schema))
        if settled is not None:
            return settled
        new_retry_noise = None
        read = None  # the records this release reads (None: it carries no new data)
        if self.init is not None:
            return [Refusal(f"round {r}: the initial score was already released", r)]
        self.gate.attempt("init", None)
        stored_init, release = self.ledger.init_vector(), plan.releases["init"]
        if stored_init is not None:  # a retry: the identical noisy vector, never a second one
            x, noise = stored_init
            if plan.noise == "central":  # the un-noised vector was sent once; retries carry a full share
                retry_noise = self.ledger.init_retry_noise()
                if retry_noise is None:
                    retry_noise = new_retry_noise = draw_share(plan, release, self.randomness, participants=None,
                                                               retry=True)
                noise = retry_noise
        else:
            read = np.ones(local.n, bool)
            x = local.init_sums()
            noise = draw_share(plan, release, self.randomness, participants=None, retry=False,
                               ahead=self._init_share)  # drawn ahead (isolated sampler), used once
            self._init_share = None

        def record() -> None:
            if read is not None:  # the gate: this release, charged to exactly the records it read
                self.gate.charge("init", read, None, None, r)
            self.ledger.log_contribution(r, "init", None, True, None, None, None)
            if stored_init is None:
                self.ledger.set_init_vector(x, noise)
            if new_retry_noise is not None:
                self.ledger.set_init_retry_noise(new_retry_noise)

        return self.masked_input(ev, start, x, noise, record)

    def remember_leaf_index(self, tree: int, leaf: np.ndarray) -> None:
        """Keep the leaf index a tree's contribution computed, to apply the released tree without recomputing it."""
        self._leaf_cache = {tree: leaf}

    def masked_input(self, ev: RoundStartMsg, start: RoundStart, x: np.ndarray | None, noise: np.ndarray | None = None,
                     record=None) -> list[Reply]:
        """The reply to round ``start`` for every round kind: secagg masks ``x`` (+ ``noise``) in one ledger
        transaction with ``record()`` (the caller's bookkeeping, run only if secagg accepted the round).  A round
        secagg refuses (ProtocolAbort: e.g. a participant set without this site or smaller than t; a malformed
        or replayed request; a bad vector) becomes a Refusal and records nothing.  ``x`` None: the stored
        masked input of a round started before (see :meth:`replayed_input`)."""
        r = start.round_id
        with self.ledger.transaction():
            try:
                masked = self.secagg.handle_round_start(start, x, noise)
            except ProtocolAbort as e:  # persisted by secagg (commits with this transaction)
                log.warning(f"{self.site_id}: round {r} refused: {e}", extra={"event": "secagg_abort"})
                return [Refusal(f"round {r}: {e}", r)]
            except (InvalidMessage, FixedPointError, TypeError, ValueError) as e:
                return [Refusal(f"round {r}: {e}", r)]
            if record is not None:
                record()
        return [InputReply(ev.purpose, ev.tree, masked.to_bytes())]

    def settled_input(self, ev, start, expected_len: int) -> list | None:
        """The answer to a round that needs no new input — a refusal of a vector length other than
        ``expected_len``, or the stored input of a round started before (:meth:`replayed_input`) — or None."""
        r = start.round_id
        if start.vector_len != expected_len:
            return [Refusal(f"round {r}: vector length {start.vector_len}, expected {expected_len} for "
                            f"{ev.purpose.name}", r)]
        return self.replayed_input(ev, start)

    def replayed_input(self, ev, start) -> list | None:
        """The answer to a round started before (e.g. before this process restarted): secagg answers with the
        stored masked input (already charged) or refuses a changed request; nothing new is computed or charged.
        None for a round this site has not started."""
        if self.secagg.round_stage(start.round_id) is None:
            return None
        return self.masked_input(ev, start, None)

    def _eval_round_start(self, ev: RoundStartMsg, start: RoundStart) -> list[Reply]:
        """The federated evaluation: the stored (or a new, once-drawn) noisy vector, charged before it leaves."""
        r = start.round_id
        if self.plan.eval_spec is not None and (self.init is None or
                                                len(self.trees) < self.plan.hyperparameters.total_rounds):
            raise NeedCatchUp(len(self.trees), self.plan.hyperparameters.total_rounds)
        refusal = check_request(self.plan, start.vector_len, len(self.trees), self.init is not None)
        if refusal is not None:
            return [Refusal(f"round {r}: {refusal}", r)]
        model = build_model(self.plan, self.init, self.trees)
        self._check_pinned_model(model)  # before the evaluation input is computed
        stored = self.ledger.eval_vector()
        if stored is not None:
            (x, noise), charge = stored, None
        else:
            x, noise, charge = eval_input(self.plan, model, self.held_out, self.randomness)

        def record() -> None:
            self.ledger.set_eval_vector(x, noise, charge | {"round_id": r})
            self.gate.charge("eval", None, round_id=r, role="eval")  # the held-out file's one ε_eval release

        replies = self.masked_input(ev, start, x, noise, None if charge is None else record)
        if isinstance(replies[0], Refusal):
            return replies
        log.info(f"{self.site_id}: evaluation input sent (round {r}, ε_eval = {self.plan.eval_epsilon:g}"
                 f"{', a retry: the stored vector' if charge is None else ''})",
                 extra={"event": "eval_sent", "site": self.site_id, "round_id": r})
        return replies

    # ------------------------------------------------------------------ releases

    def _set_init(self, init: InitScoreMsg) -> None:
        if self.trees:
            raise self._abort("an initial score arrived after trees were applied")
        self.init = init
        if self.plan.schema.task == "multiclass" and len(init.scores) not in (0, self.plan.schema.n_classes):
            raise self._abort(f"the initial score has {len(init.scores)} class margins, the plan has "
                              f"{self.plan.schema.n_classes} classes")
        self.local.set_init_score(init.value)

    def _apply_tree(self, t: TreeMsg) -> None:
        hp = self.plan.hyperparameters
        if self.init is None:
            raise self._abort(f"tree {t.index} arrived before the initial score")
        splits = self.rounds.released_splits(t)  # checked by the plan's mode (common/modes/site_rounds.py)
        if not (np.array_equal(t.features, splits.features) and np.array_equal(t.thresholds, splits.thresholds)):
            raise self._abort(f"tree {t.index} does not use the plan's public random splits")
        if t.leaves.shape != (round_vector_len(self.plan.schema, hp) // 2,) or not np.isfinite(t.leaves).all() or \
                np.abs(t.leaves).max() > hp.leaf_clip:
            raise self._abort(f"tree {t.index} has leaf values outside [−β, β] = ±{hp.leaf_clip}")
        leaf = self._leaf_cache.pop(t.index, None)
        if leaf is None:
            leaf = self.local.leaf_index(splits)  # codes or floats, NaN by the default directions
        self.local.apply(leaf, t.leaves)
        self.trees.append(t)
        if self.cpu_at_first_tree is None:
            self.cpu_at_first_tree = time.process_time()

    def _check_pinned_model(self, model) -> None:
        """An evaluation-only plan: the model rebuilt from the released trees must be the one the plan pins."""
        pinned = self.plan.eval_model_content_sha256
        if self.plan.eval_model_sha256 is None:
            return
        have = model_content_sha256(model)
        if have != pinned:
            raise self._abort(f"the coordinator released another model than the plan pins for evaluation (its "
                              f"trees have content digest {have}, the plan's evaluation.model_content_sha256 is "
                              f"{pinned}); refusing to evaluate it")

    def _finish(self, ev: FinishedMsg) -> list[Reply]:
        if len(self.trees) < ev.trees or self.init is None:
            raise NeedCatchUp(len(self.trees), ev.trees)
        if len(self.trees) != ev.trees:
            raise self._abort(f"the coordinator finished with {ev.trees} trees, this site applied {len(self.trees)}")
        model = build_model(self.plan, self.init, self.trees)
        self._check_pinned_model(model)
        data = model_bytes(model)
        sha = hashlib.sha256(data).hexdigest()
        if sha != ev.model_sha256:
            raise self._abort(f"the model rebuilt from the released trees has hash {sha}, the coordinator "
                              f"announced {ev.model_sha256}")
        out = self.options.model_out or model_path(self.state_dir, self.plan.sha256)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out)
        self.stage = SiteDone(sha, out)
        self.close()
        log.info(f"{self.site_id}: model verified ({sha[:16]}…) and written to {out}",
                 extra={"event": "site_done", "site": self.site_id, "model_sha256": sha, "path": str(out)})
        self._evaluation_released(ev.evaluation, out, sha)
        return [Done(sha)]

    def _evaluation_released(self, release, model_path: Path, sha: str) -> None:
        """The plan's federated evaluation as released: the metrics and their intervals recomputed here from the
        noisy sum the coordinator sent (post-processing, the coordinator's own receipt function), logged and
        written next to the model (``model-<plan>.json`` → ``model-<plan>.evaluation.json``: a tuning plan's trials keep one each).  A release that does not fit the plan is logged and
        ignored: the model stands on its own hash."""
        import json

        from fedsbdt.common.fed_eval import describe_receipt
        from fedsbdt.common.files import write_atomic

        plan, spec = self.plan, self.plan.eval_spec
        if spec is None or release is None:
            return
        if not release.total:
            self.evaluation_released = {"failed": release.failed or "no reason given"}
            log.warning(f"{self.site_id}: federated evaluation: {describe_receipt(self.evaluation_released)}",
                        extra={"event": "evaluation_released", "site": self.site_id})
            return
        if (len(release.total) != spec.length or not set(release.sites) <= set(plan.site_ids)
                or len(release.sites) < plan.threshold):
            log.warning(f"{self.site_id}: the coordinator's evaluation release does not fit the plan ({len(release.total)} "
                        f"entries for {spec.length}, sites {list(release.sites)}); ignored",
                        extra={"event": "evaluation_ignored", "site": self.site_id})
            return
        receipt = evaluation_receipt(plan, np.asarray(release.total, dtype=np.int64), release.round_id,
                                     release.sites) | {"model_sha256": sha}
        self.evaluation_released = receipt
        try:
            path = write_atomic(model_path.with_suffix(".evaluation.json"), json.dumps(receipt, sort_keys=True, indent=1),
                                "evaluation")
        except (OSError, ValueError) as e:  # OutputError is a ValueError: the metrics are still logged
            path = f"not written ({e})"
        log.info(f"{self.site_id}: federated evaluation released (ε_eval = {receipt['epsilon_eval']:g}, sites "
                 f"{', '.join(receipt['sites'])}): {describe_receipt(receipt)}; receipt {path}",
                 extra={"event": "evaluation_released", "site": self.site_id, "evaluation": receipt,
                        "path": str(path)})

    def receipt(self) -> dict:
        """What this site contributed: trees applied, trees whose leaf release carried its data (and those
        that did not: its budget was spent by failed attempts), failed attempts, its lifetime (ε, δ)."""
        rows = self.ledger.db.execute("SELECT DISTINCT tree FROM contributions WHERE kind = 'tree' AND with_data = 1"
                                      ).fetchall()
        with_data = {int(r[0]) for r in rows}
        without = [t for t in self.trees if t.index not in with_data]
        out = {"trees": len(self.trees), "trees_with_data": len(with_data & set(range(len(self.trees)))),
               "trees_without_data": [t.index for t in without],
               # why: released from a sum this site was not in (not connected, suspended, joining) ...
               "trees_without_this_site": [t.index for t in without if self.site_id not in t.sites],
               # ... or it was in the sum with a zero input (its records' scheduled releases were spent)
               "trees_with_zero_input": [t.index for t in without if self.site_id in t.sites],
               "failed_attempts": self.ledger.failed_attempts()}
        if not self.gate.mode.trains(self.plan):
            out["trees_with_data"] = 0
            out["trees_without_data"] = out["trees_without_this_site"] = out["trees_with_zero_input"] = []
        out["lifetime"] = self.gate.lifetime_receipt()
        return out

    def close(self) -> None:
        """Stop the background noise sampler (undrawn shares are discarded)."""
        if getattr(self, "noise", None) is not None:
            self.noise.close()
        if getattr(self, "gate", None) is not None:
            self.gate.close()

    def abort(self, reason: str) -> SessionAbort:
        """End the session at this site (``raise site.abort(reason)``): logged, the stage set, samplers closed."""
        return self._abort(reason)

    def _abort(self, reason: str) -> SessionAbort:
        self.close()
        self.stage = SiteAborted(reason)
        log.error(f"{self.site_id}: {reason}", extra={"event": "aborted", "site": self.site_id})
        return SessionAbort(reason)
