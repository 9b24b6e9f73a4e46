"""The plan: the public "bulletin board" of one federated training session (design.md "Session" 1).

A plan is a TOML file every party can read and hash::

    [session]
    id = "abalone-2025"
    threshold = 2                 # t: every accepted sum has ≥ t sites' inputs
    assumed_colluders = 0         # c: the guarantee holds if at most c sites collude with the coordinator
                                  #   (2t > n + c; `fedsbdt plan` defaults to the largest, 2t − n − 1)
    dropout_slack = 0             # s (0 ≤ s ≤ n − t): a round's leaf noise is split into
                                  #   k_r = max(t, |P_r| − s) − c shares (docs/federation.md §5)
    noise = "distributed"         # or "central" (the coordinator adds the noise: trust it)
    epoch_rounds = 64             # secure-aggregation round slots prepared per epoch
    max_records_per_site = 100000 # public bound for the fixed-point capacity check
    max_attempts = 20             # attempts per round before the session gives up
    randomness = "secure"         # "insecure-test" only in tests (sites refuse it by default)
    sampler = "ours"              # exact noise sampler: "ours" (default) or "opendp" (~30x slower)

    [secure_aggregation]          # optional; omitted = the complete graph (every site masks with every other)
    graph = "sparse"              # Bell et al.: each site masks with k neighbours of a public random graph
    neighbours = 32               # k (even, below n − 1; docs/secagg.md §10 says how to choose it)
    fast_path = "auto"            # "auto" (default), "always" or "never": rounds without the consistency and
                                  #   unmask exchanges (docs/federation.md §10 "Messages merged")

    [deadlines]                   # seconds
    join = 120                    # wait for the whole roster before starting with ≥ t sites
    stage = 10                    # per secure-aggregation stage
    quorum = 600                  # give up after this long with fewer than t usable sites
    finish = 30                   # after the last tree, wait for the sites' confirmations

    [privacy]                     # what the plan's author computed; every party recomputes it
    sigma = 1.23
    epsilon = 0.99

    [hyperparameters]             # common/config.py names; `seed` (public split seed) is required
    ...
    [schema]                      # the public schema, inline (same keys as examples/*/schema.toml)
    ...
    [evaluation]                  # optional: federated evaluation after training (docs/federated-evaluation.md)
    epsilon = 0.1                 # ε_eval, charged to the sites' held-out files (not to training records)
    bins = 20                     # public score (binary) or residual (regression) bins
    residual_clip = 7.0           # regression: residuals clipped to ±R (default: label range width / 4)
    model_sha256 = "…"            # optional: evaluate this existing model; no training rounds
    model_content_sha256 = "…"    # with model_sha256: digest of its initial score and trees (sites check it)

    [[sites]]
    id = "hospital-a"
    identity_key = "<64 hex digits: raw Ed25519 public key>"

The **canonical form** is the JSON of :meth:`Plan.to_dict` (sorted keys, no
whitespace); its SHA-256 is the plan hash that sites compare against what
they were given out of band and that the secure-aggregation session digest
binds.  Formatting, comments and key order in the TOML file do not change it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fedsbdt.common.accountant import AccountingError, PrivacyCalibration
from fedsbdt.common.guarantee import collusion_guarantee, default_colluders
from fedsbdt.common.config import SAMPLERS, ConfigError, Hyperparameters
from fedsbdt.common.files import write_atomic
from fedsbdt.common.multiclass import init_vector_len
from fedsbdt.common.schema import Schema, SchemaError

from . import accounting
from .accounting import PRIVACY_RTOL, federated_calibration  # noqa: F401 - re-exported
from .errors import PlanError

FORMAT = "fedsbdt-plan"
VERSION = 1
NOISE_MODES = ("distributed", "central")
RANDOMNESS = ("secure", "insecure-test")
FAST_PATHS = ("auto", "always", "never")  # [secure_aggregation] fast_path (Plan.fast_round)
MAX_EPOCH_ROUNDS = 256
#: Largest relative excess η of the per-tree RDP slope a sum of discrete Gaussian noise shares may have over
#: the accounted 1/σ² (Kairouz–Liu–Steinke τ term, :meth:`Plan.share_closeness`): 2^−40.
MAX_SHARE_EXCESS = 2.0 ** -40



@dataclass(frozen=True)
class Deadlines:
    join: float = 120.0
    stage: float = 10.0
    quorum: float = 600.0
    finish: float = 30.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PlanError(f"deadlines.{f.name} = {v!r}: must be a positive number of seconds")
            object.__setattr__(self, f.name, float(v))


@dataclass(frozen=True)
class SiteEntry:
    """A roster entry: site id and its pinned raw Ed25519 identity public key."""

    site_id: str
    identity_key: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.site_id, "identity_key": self.identity_key.hex()}


def _check_site_id(site_id: object, source: str) -> str:
    from fedsbdt.common.secagg.encoding import check_site_id
    from fedsbdt.common.secagg.errors import InvalidMessage

    try:
        return check_site_id(site_id)
    except InvalidMessage as e:
        raise PlanError(f"{source}: {e}") from None


def check_trust_parameters(n: int, t: int, c: int, s: int) -> None:
    """The planner's rule for (n, t, c, s): 1 ≤ t ≤ n, c ≥ 0, 2t > n + c, 0 ≤ s ≤ n − t (else PlanError)."""
    if not 1 <= t <= n:
        raise PlanError(f"session.threshold = {t}: must be between 1 and the roster size {n}")
    if c < 0 or not 2 * t > n + c:
        raise PlanError(f"session.threshold = {t} is too low for {n} sites and {c} assumed colluders: "
                        f"secure aggregation needs 2t > n + colluders, i.e. t ≥ {(n + c) // 2 + 1}")
    if not 0 <= s <= n - t:
        raise PlanError(f"session.dropout_slack = {s}: must be between 0 and n − t = {n - t} "
                        f"({n} sites, threshold {t})")


def _share_excess(coords, k_max: int, n: int) -> tuple[float, float]:
    """(smallest share std, η) for coordinates ``(full noise scale S, sensitivity Δ)`` split ``k_max`` ways
    (:meth:`Plan.share_closeness`)."""
    num = den = 0.0
    smallest = math.inf
    for S, delta in coords:
        v = S * S / k_max
        smallest = min(smallest, math.sqrt(v))
        tau = 10.0 * sum(math.exp(-2.0 * math.pi ** 2 * v * k / (k + 1)) for k in range(1, n))
        l = delta / S
        num += l * tau + tau * tau / 2.0
        den += l * l / 2.0
    return smallest, num / den


def _section(d: dict, name: str, source: str, required: bool = True) -> dict[str, Any]:
    """Section ``[name]`` of a plan's parsed form (a table; ``{}`` for an optional one that is absent)."""
    v = d.get(name)
    if v is None:
        if required:
            raise PlanError(f"{source}: missing [{name}] section")
        return {}
    if not isinstance(v, dict):
        raise PlanError(f"{source}: [{name}] must be a table")
    return v


def _roster(raw_sites: Any, source: str) -> list[SiteEntry]:
    """The plan's ``[[sites]]``: each exactly an id and a raw Ed25519 public key (64 hex digits)."""
    if not isinstance(raw_sites, list) or not raw_sites:
        raise PlanError(f"{source}: the roster ([[sites]]) is missing or empty")
    sites = []
    for i, e in enumerate(raw_sites):
        if not isinstance(e, dict) or set(e) != {"id", "identity_key"}:
            raise PlanError(f"{source}: sites[{i}] must have exactly 'id' and 'identity_key'")
        sid = _check_site_id(e["id"], f"{source}: sites[{i}]")
        key = e["identity_key"]
        try:
            raw = bytes.fromhex(key) if isinstance(key, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise PlanError(f"{source}: site {sid!r}: identity_key must be 64 hex digits (a raw Ed25519 "
                            "public key, as written by `fedsbdt keygen` to identity.pub)")
        sites.append(SiteEntry(sid, raw))
    return sites


def _is_sha256(h: object) -> bool:
    return isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h)


def noise_divisor(t: int, c: int, s: int, participants: int) -> int:
    """k_r = max(t, |P_r| − s) − c (≥ t − c ≥ 1 under 2t > n + c): the leaf noise is split k_r ways."""
    return max(t, participants - s) - c


@dataclass(frozen=True)
class Plan:
    session_id: str
    schema: Schema
    hyperparameters: Hyperparameters
    sites: tuple[SiteEntry, ...]
    threshold: int
    stated_sigma: float
    stated_epsilon: float
    noise: str = "distributed"
    assumed_colluders: int = 0
    dropout_slack: int = 0
    epoch_rounds: int = 64
    max_records_per_site: int = 1_000_000
    max_attempts: int = 20
    randomness: str = "secure"
    sampler: str = "ours"
    test_seed: int = 0
    test_noise: bool = True
    deadlines: Deadlines = field(default_factory=Deadlines)
    eval_epsilon: float | None = None  # [evaluation] epsilon: ε_eval of the federated evaluation (None: none)
    eval_bins: int = 20  # [evaluation] bins: public score / residual bins (common/fed_eval.py)
    eval_model_sha256: str | None = None  # [evaluation] model_sha256: evaluate this existing model (no training)
    #: [evaluation] model_content_sha256: the digest of that model's initial score and trees
    #: (release.model_content_sha256): what every site checks the released trees against
    eval_model_content_sha256: str | None = None
    eval_residual_clip: float | None = None  # [evaluation] residual_clip: R of a regression evaluation
    secagg_graph: str = "complete"  # [secure_aggregation] graph: "complete" or "sparse" (common/secagg/graph.py)
    secagg_neighbours: int = 0  # [secure_aggregation] neighbours: k of the sparse graph
    secagg_fast_path: str = "auto"  # [secure_aggregation] fast_path: "auto", "always" or "never" (FAST_PATHS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", tuple(sorted(self.sites, key=lambda s: s.site_id)))
        self._check_roster()
        self._check_mode()
        self._check_session()
        self._check_privacy_statement()
        self._check_messages()
        self._check_evaluation()
        self.secagg_config()  # threshold and fixed-point capacity checks
        self.check_discrete_noise()

    def _check_roster(self) -> None:
        if not isinstance(self.session_id, str) or not 1 <= len(self.session_id) <= 128:
            raise PlanError("session.id must be a string of 1-128 characters")
        ids = [s.site_id for s in self.sites]
        if len(set(ids)) != len(ids):
            raise PlanError("the roster lists a site twice")
        if len({s.identity_key for s in self.sites}) != len(ids):
            raise PlanError("the roster lists one identity key for two sites")
        if len(ids) < 2:
            raise PlanError("a federation needs at least two sites in the roster")

    def _check_mode(self) -> None:
        """The tree builder's mode federates these hyperparameters and this schema (its own checks)."""
        from fedsbdt.common.modes import UnknownMode, training_mode

        hp = self.hyperparameters
        try:
            mode = training_mode(hp)
        except UnknownMode as e:
            raise PlanError(f"tree_builder = {hp.tree_builder!r} is not available in a federation ({e})") from None
        if not mode.federated:
            raise PlanError(f"tree_builder = {hp.tree_builder!r} is not available in a federation yet; use it "
                            "with `fedsbdt train`")
        refusal = mode.plan_refusal(self)
        if refusal is not None:
            raise PlanError(refusal)
        if hp.candidate_placement != "schema":
            raise PlanError("candidate_placement = \"quantile\" (DP quantile split candidates) is for `fedsbdt "
                            "train`; a federation splits on the candidates its schema places (equidistant, or "
                            "scale = \"log\" / cuts per feature; docs/data-sources.md#split-candidates)")
        if self.schema.task == "multiclass":
            from fedsbdt.common.multiclass import check_supported

            try:
                check_supported(hp)
            except ConfigError as e:
                raise PlanError(str(e)) from None

    def _check_session(self) -> None:
        for name in ("threshold", "assumed_colluders", "dropout_slack", "epoch_rounds", "max_records_per_site",
                     "max_attempts", "test_seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise PlanError(f"session.{name} = {v!r}: must be an integer")
        check_trust_parameters(self.n, self.threshold, self.assumed_colluders, self.dropout_slack)
        if self.secagg_graph not in ("complete", "sparse"):
            raise PlanError(f"secure_aggregation.graph = {self.secagg_graph!r}: must be \"complete\" or \"sparse\"")
        k = self.secagg_neighbours
        if isinstance(k, bool) or not isinstance(k, int) or (self.secagg_graph == "complete" and k != 0):
            raise PlanError(f"secure_aggregation.neighbours = {k!r}: an even integer, and only with graph = \"sparse\"")
        for name, value, allowed in (("secure_aggregation.fast_path", self.secagg_fast_path, FAST_PATHS),
                                     ("session.noise", self.noise, NOISE_MODES),
                                     ("session.randomness", self.randomness, RANDOMNESS),
                                     ("session.sampler", self.sampler, SAMPLERS)):
            if value not in allowed:
                raise PlanError(f"{name} = {value!r}: must be one of {', '.join(allowed)}")
        if not 1 <= self.epoch_rounds <= MAX_EPOCH_ROUNDS:
            raise PlanError(f"session.epoch_rounds = {self.epoch_rounds}: must be in 1..{MAX_EPOCH_ROUNDS}")
        if not 1 <= self.max_records_per_site <= 2**40:
            raise PlanError("session.max_records_per_site must be in 1..2^40")
        if not 1 <= self.max_attempts <= 10_000:
            raise PlanError("session.max_attempts must be in 1..10000")
        if self.test_seed < 0:
            raise PlanError("session.test_seed must be ≥ 0")
        if not isinstance(self.test_noise, bool):
            raise PlanError("session.test_noise must be true or false")

    def _check_messages(self) -> None:
        from .wire import MAX_MESSAGE_BYTES, estimated_largest_message

        est = estimated_largest_message(self.n, self.epoch_rounds, self.hyperparameters.depth, self.max_vector_len,
                                        self.schema.n_classes,
                                        holders=self.secagg_neighbours + 1 if self.secagg_graph == "sparse" else None)
        if est > MAX_MESSAGE_BYTES // 2:
            raise PlanError(f"{self.n} sites with epoch_rounds = {self.epoch_rounds} would need messages of about "
                            f"{est / 2**20:.1f} MiB (limit {MAX_MESSAGE_BYTES // 2**21} MiB); lower epoch_rounds")

    def _check_privacy_statement(self) -> None:
        if self.hyperparameters.seed is None:
            raise PlanError("hyperparameters.seed is required: the public split seed must be fixed in the plan "
                            "so that every site recomputes the same trees")
        for name in ("stated_sigma", "stated_epsilon"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise PlanError(f"privacy.{name.split('_')[1]} must be a positive number")

    def _check_evaluation(self) -> None:
        if self.eval_epsilon is not None:
            self.eval_spec  # noqa: B018 - validates the [evaluation] section
        h = self.eval_model_sha256
        if h is not None and (self.eval_epsilon is None or not _is_sha256(h)):
            raise PlanError("evaluation.model_sha256 must be 64 lower-case hex digits (with evaluation.epsilon)")
        c = self.eval_model_content_sha256
        if c is not None and (h is None or not _is_sha256(c)):
            raise PlanError("evaluation.model_content_sha256 must be 64 lower-case hex digits (with "
                            "evaluation.model_sha256)")

    # ------------------------------------------------------------------ derived

    @property
    def site_ids(self) -> tuple[str, ...]:
        return tuple(s.site_id for s in self.sites)

    @property
    def n(self) -> int:
        return len(self.sites)

    @property
    def noise_shares(self) -> int:
        """The fewest shares a round's leaf noise is ever split into: t − c (the largest share variance)."""
        return self.threshold - self.assumed_colluders

    def noise_divisor(self, participants: int) -> int:
        """k_r = max(t, p − s) − c: the leaf noise of a round with p participants is split into k_r shares.

        A public function of the plan and |P_r|, recomputed by every site from the RoundStart it
        answers (never taken from the coordinator).  A site signs the survivor set U3 only if
        |U3| − c ≥ k_r, so every released sum holds at least (|U3| − c)·σ²/k_r ≥ σ² of honest noise.
        """
        p = int(participants)
        if not self.threshold <= p <= self.n:
            raise PlanError(f"a round with {p} participants is impossible for t = {self.threshold}, n = {self.n}")
        return noise_divisor(self.threshold, self.assumed_colluders, self.dropout_slack, p)

    def min_survivors(self, participants: int) -> int:
        """The smallest survivor set |U3| a site signs in a round with p participants: k_r + c."""
        return self.noise_divisor(participants) + self.assumed_colluders

    def leaf_share_scales(self, shares: int):
        """Per-coordinate std (fixed-point units) of one site's leaf-noise share when split into ``shares`` (the
        plan's ``tree`` release, :attr:`releases`)."""
        if not self.noise_shares <= shares <= self.n:
            raise PlanError(f"leaf noise cannot be split into {shares} shares (t − c = {self.noise_shares}, "
                            f"n = {self.n})")
        return self.releases["tree"].scales(shares)

    @cached_property
    def releases(self):
        """Every release kind of the plan → its declaration (common/modes/releases.py): the noise every party
        draws for it and the privacy event the sites' gates charge, derived from that noise.  Read-only."""
        from types import MappingProxyType

        from fedsbdt.common.modes import mode_for

        return MappingProxyType(mode_for(self).releases(self))

    @cached_property
    def _grids(self) -> dict:
        from fedsbdt.common.modes import training_mode

        return training_mode(self.hyperparameters).plan_grids(self)

    @property
    def greedy_grid(self):
        """Greedy (and DPBoost) trees: the public candidate grid and level layouts (``None`` otherwise; the
        tree builder's mode makes it, ``Mode.plan_grids``)."""
        return self._grids.get("greedy_grid")

    @property
    def max_vector_len(self) -> int:
        """The longest secure-aggregation vector: the longest of a tree's rounds (the tree builder's mode says:
        the leaf sums, a greedy tree's deepest level, a Sarus sketch), the initial score's sums or the federated
        evaluation's histogram."""
        from fedsbdt.common.modes import training_mode

        return max(training_mode(self.hyperparameters).max_vector_len(self), init_vector_len(self.schema),
                   0 if self.eval_spec is None else self.eval_spec.length)

    @property
    def sarus_grid(self):
        """Sarus trees: the fine sketch grid and the shapes of their rounds (``None`` otherwise)."""
        return self._grids.get("sarus_grid")

    def level_share_scales(self, tree: int, level: int, shares: int):
        """Per-entry std (integer units) of one site's share of a level's noise when split into ``shares``."""
        if not 1 <= shares <= self.n:
            raise PlanError(f"level noise cannot be split into {shares} shares (n = {self.n})")
        return self.releases["level"].scales(shares, tree=tree, level=level)

    @cached_property
    def eval_spec(self):
        """The federated evaluation this plan declares (common/fed_eval.py), or ``None``."""
        if self.eval_epsilon is None:
            return None
        from fedsbdt.common.fed_eval import EvalError, EvalSpec

        try:
            return EvalSpec(self.schema.task, self.eval_epsilon, self.hyperparameters.delta, self.eval_bins,
                            self.schema.label_range, self.eval_residual_clip, self.schema.classes)
        except EvalError as e:
            raise PlanError(str(e)) from None

    @property
    def guarantee(self) -> str:
        """Whom the guarantee covers, exactly, in terms of the declared c (common/guarantee.py)."""
        text = collusion_guarantee(self.n, self.threshold, self.assumed_colluders, self.dropout_slack, self.noise)
        if self.secagg_graph == "sparse":
            lt = self.secagg_config().local_threshold
            text += (f" Secure aggregation runs on a sparse graph (k = {self.secagg_neighbours} neighbours, local "
                     f"threshold t_k = {lt.threshold}, at most {lt.colluder_bound} colluders per neighbourhood except "
                     f"with probability ≤ {lt.failure_bound:.2g}): no site's input is opened, but a coordinator that "
                     "lies about dropouts may unmask sums over parts of a round's survivors, so the σ² noise bound "
                     "holds only against a coordinator that follows the protocol (docs/secagg.md §10).")
        if self.secagg_fast_path == "always":
            text += (" Every round takes the fast path (fast_path = \"always\"): a round in which any participant's "
                     "input is missing releases nothing and is retried.")
            if self.secagg_graph == "sparse":
                text += (" On the sparse graph this makes the session fast-only: every site refuses the signed path, "
                         "so no site's mask key is ever revealed (docs/secagg.md §10).")
        return text

    def fast_round(self, required_survivors: int, participants: int) -> bool:
        """Whether a round with this many participants, of which ``required_survivors`` must send their input,
        runs the fast secure-aggregation path (one message each way; docs/federation.md §10).

        "auto": on the complete graph when the round tolerates no missing input anyway; "always": every
        round (on the sparse graph a fast-only session, docs/secagg.md §10); "never": no round.
        """
        if self.secagg_fast_path == "always":
            return True
        return self.secagg_fast_path == "auto" and self.secagg_graph == "complete" and required_survivors >= participants

    @property
    def insecure(self) -> bool:
        return self.randomness != "secure"

    @property
    def trains(self) -> bool:
        """False for an evaluation-only plan (``evaluation.model_sha256``): it releases no trees."""
        return self.eval_model_sha256 is None

    @property
    def total_epsilon(self) -> float:
        """The budget a site accepts for this plan, which its ``--max-epsilon`` must allow: the training ε (if the
        plan trains) plus ε_eval (if it evaluates) — what a record in both files would lose (client/gate.py)."""
        return ((self.stated_epsilon if self.trains else 0.0)
                + (float(self.eval_epsilon) if self.eval_epsilon is not None else 0.0))

    def budget_text(self) -> str:
        """The plan's privacy budget for people, the total whenever there are two parts:
        ``ε = 1 (training records) + ε_eval = 0.5 (held-out records) = 1.5 in total``, or ``ε = 1``."""
        parts = ([f"ε = {self.stated_epsilon:.6g}"] if self.trains else []) + (
            [f"ε_eval = {self.eval_epsilon:.6g}"] if self.eval_epsilon is not None else [])
        if len(parts) == 1:
            return parts[0]
        return (f"{parts[0]} (training records) + {parts[1]} (held-out records) = {self.total_epsilon:.6g} in total "
                "(what a site's --max-epsilon must allow)")

    def identity_key(self, site_id: str) -> bytes | None:
        for s in self.sites:
            if s.site_id == site_id:
                return s.identity_key
        return None

    @cached_property
    def canonical_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False,
                          ensure_ascii=False).encode("utf-8")

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json).hexdigest()

    @cached_property
    def encoding(self):
        from fedsbdt.common.boosting import Encoding

        return Encoding.for_schema(self.hyperparameters, self.schema)

    def calibration(self) -> PrivacyCalibration:
        """The accountant's calibration for the plan's hyperparameters (common/federation/accounting.py)."""
        return accounting.calibration(self)

    def verify_privacy(self) -> PrivacyCalibration:
        """Recompute σ and ε with the local accountant; refuse a plan whose stated values differ
        (common/federation/accounting.py)."""
        return accounting.verify_privacy(self)

    def check_release_accounting(self) -> None:
        """Refuse a plan whose statement of ε is not what its releases cost (common/federation/accounting.py)."""
        accounting.check_release_accounting(self)

    def noise_scales(self):
        """(largest leaf noise share scales, initial-score share scales) a site adds, in fixed-point units.

        Distributed mode: the leaf noise split into t − c shares — the largest share any round uses
        (a round splits it into k_r ≥ t − c shares, :meth:`noise_divisor`); the bound secure
        aggregation range-checks noise shares against.  A full discrete-Laplace initial-score share.
        Central mode: sites add nothing (both ``None``).
        """
        if self.noise != "distributed":
            return None, None
        rel = self.releases
        leaf = rel["tree"].scales(self.noise_shares) if "tree" in rel else None
        init = rel["init"].scales() if "init" in rel else None
        return leaf, init

    def central_retry_noise_scales(self):
        """Central mode: (leaf, initial-score) scales of the full noise share a site adds to a *retry*.

        A site's un-noised vector enters at most one attempt of a logical round; every later attempt
        of it carries the whole leaf noise (a discrete Gaussian, one share: Thm. 16) or a whole
        discrete-Laplace initial-score share, so differencing two attempts never isolates one site's
        exact sums (docs/threat-model.md "Retries").  Distributed mode: ``None`` (every input is noised).
        """
        if self.noise != "central":
            return None
        rel = self.releases
        return (rel["tree"].scales(1) if "tree" in rel else None, rel["init"].scales() if "init" in rel else None)

    def share_closeness(self) -> tuple[float, float]:
        """(smallest leaf-noise share std in integer units, relative RDP excess η) of distributed noise.

        The honest part of a released sum is a sum of m ≤ n independent discrete Gaussians
        N_Z(0, v) with m·v ≥ S², S the coordinate's full noise scale — not itself a discrete
        Gaussian.  Kairouz, Liu and Steinke (ICML 2021, Prop. 14, one coordinate) bound its Rényi
        divergence for sensitivity Δ by α/2·(Δ/S + τ)², τ = 10·Σ_{k=1}^{m−1} exp(−2π²v·k/(k+1)).
        Summed over the two coordinates a record touches (its leaf's Hessian and gradient sums),
        the per-tree slope in α is Σ_j (l_j + τ_j)²/2 with l_j = Δ_j/S_j, against the accounted
        Σ_j l_j²/2 = 1/σ² (Thm. 16); η = Σ_j (l_j·τ_j + τ_j²/2) / Σ_j l_j²/2 is the relative excess.
        τ is evaluated at m = n and at the smallest share (largest divisor k_r), an upper bound for
        every round.  Central mode: one discrete Gaussian, exact (Canonne–Kamath–Steinke), η = 0.
        """
        if self.noise != "distributed":
            return math.inf, 0.0
        from fedsbdt.common.boosting import leaf_noise_scales

        hp, enc = self.hyperparameters, self.encoding
        full = leaf_noise_scales(hp, enc, self.calibration().sigma, shares=1)
        k_max = self.noise_divisor(self.n)
        L = hp.leaves
        coords = ((float(full[0]), enc.hess.bound_units), (float(full[L]), enc.grad.bound_units))
        smallest, eta = _share_excess(coords, k_max, self.n)
        if enc.classes > 1:  # a record touches K coordinates of each kind; the accounted slope is 1/σ²
            eta *= sum((d / S) ** 2 / 2.0 for S, d in coords) * enc.classes * self.calibration().sigma ** 2
        from fedsbdt.common.modes import training_mode

        for group in training_mode(hp).share_coordinates(self):  # a level's, a sketch's entries (the mode's)
            s2, eta2 = _share_excess(group, k_max, self.n)
            smallest, eta = min(smallest, s2), max(eta, eta2)
        return smallest, eta

    def check_discrete_noise(self) -> None:
        """Refuse distributed noise whose shares are too coarse for the accountant (docs/privacy.md).

        Needs η ≤ MAX_SHARE_EXCESS (the τ term changes ε by a relative ~1e−12 at most) and
        every share std ≥ 1/2 (the range of Prop. 14).  The PLD accountant evaluates the continuous
        Gaussian, which dominates neither one discrete Gaussian of the same scale nor a sum of shares:
        refused in any plan (the RDP bound is exact for the discrete Gaussian).
        """
        if self.hyperparameters.accountant == "pld":
            raise PlanError("the PLD accountant evaluates continuous Gaussian noise, which does not dominate the "
                            "discrete Gaussian noise sites and coordinator add (nor a sum of shares of it); use "
                            "accountant = \"rdp\" in a federation (docs/privacy.md \"PLD\")")
        if self.noise != "distributed":
            return
        try:
            smallest, eta = self.share_closeness()
        except PlanError:
            return  # an impossible budget is reported by calibration() itself
        if not (smallest >= 0.5 and eta <= MAX_SHARE_EXCESS):
            hp = self.hyperparameters
            raise PlanError(f"distributed noise too coarse for the fixed-point scale: the smallest noise share has "
                            f"std {smallest:.3g} integer units (scale_bits = {hp.scale_bits}, split "
                            f"{self.noise_divisor(self.n)} ways), so a sum of shares is not close enough to a "
                            f"discrete Gaussian (Kairouz–Liu–Steinke excess η = {eta:.3g} > {MAX_SHARE_EXCESS:.3g}); "
                            "raise scale_bits, the clip bounds or σ, or use fewer shares")

    def max_abs_input(self) -> int:
        enc = self.encoding
        units = max(enc.grad.bound_units, enc.hess.bound_units, enc.label.bound_units, 1)
        if self.eval_spec is not None:  # a held-out file has at most max_records_per_site records too
            units = max(units, self.eval_spec.max_entry(1))
        return units * self.max_records_per_site

    def noise_sigma_units(self) -> float:
        """Largest per-entry noise scale a site passes to secure aggregation (range check and capacity).

        Discrete Laplace shares are covered with a factor 2: secure aggregation accepts
        entries up to 40 × this, and P(|Lap(b)| > 80·b) = e^−80.  Central mode: the full share a
        site adds to a retry (:meth:`central_retry_noise_scales`).
        """
        leaf, init = self.central_retry_noise_scales() if self.noise == "central" else self.noise_scales()
        s = 0.0
        if leaf is not None:
            s = max(s, float(leaf.max()))
        if init is not None:
            s = max(s, 2.0 * float(init.max()))
        from fedsbdt.common.modes import training_mode

        # a level's, a sketch's noise (the mode's): the largest share (t − c shares; central: a full one)
        s = max(s, training_mode(self.hyperparameters).max_share_scale(
            self, self.noise_shares if self.noise == "distributed" else 1))
        if self.eval_spec is not None:  # every site adds a full evaluation noise share (common/fed_eval.py)
            s = max(s, float(self.eval_spec.noise_scales().max()))
        return s

    def secagg_config(self):
        """The secure-aggregation session parameters all parties derive from the plan."""
        from fedsbdt.common.secagg import SessionConfig, SiteIdentity
        from fedsbdt.common.secagg.errors import ConfigError as SecAggConfigError

        try:
            noise = self.noise_sigma_units()
        except PlanError:
            noise = 0.0  # impossible budgets are reported by calibration(); still check the rest
        try:
            return SessionConfig(
                session_id=bytes.fromhex(self.sha256),  # binds the whole plan into every key and signature
                threshold=self.threshold,
                roster=tuple(SiteIdentity(s.site_id, s.identity_key) for s in self.sites),
                assumed_colluders=self.assumed_colluders,
                max_abs_input=self.max_abs_input(),
                noise_sigma_units=noise,
                max_epoch_rounds=self.epoch_rounds,
                max_vector_len=self.max_vector_len,
                **({} if self.secagg_graph == "complete" else {"graph": "sparse", "neighbours": self.secagg_neighbours,
                                                                "fast_only": self.secagg_fast_path == "always"}),
            )
        except SecAggConfigError as e:
            raise PlanError(f"secure aggregation cannot run this plan: {e}") from None

    def make_randomness(self, allow_insecure: bool = False):
        """The plan's source of DP randomness (common/randomness.py ``plan_randomness``)."""
        from fedsbdt.common.randomness import plan_randomness

        return plan_randomness(self, allow_insecure)

    def randomness_description(self) -> str:
        if not self.insecure:
            from fedsbdt.common.randomness import describe_secure

            return describe_secure(self.sampler)
        return f"INSECURE-TEST(seed={self.test_seed}, noise={'on' if self.test_noise else 'off'})"

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        session = {
            "id": self.session_id, "threshold": self.threshold, "assumed_colluders": self.assumed_colluders,
            "dropout_slack": self.dropout_slack, "noise": self.noise, "epoch_rounds": self.epoch_rounds,
            "max_records_per_site": self.max_records_per_site, "max_attempts": self.max_attempts,
            "randomness": self.randomness,
        }
        if self.sampler != "ours":
            session["sampler"] = self.sampler
        if self.insecure:
            session["test_seed"] = self.test_seed
            session["test_noise"] = self.test_noise
        return {
            "format": FORMAT,
            "version": VERSION,
            "session": session,
            "deadlines": dataclasses.asdict(self.deadlines),
            "privacy": {"sigma": float(self.stated_sigma), "epsilon": float(self.stated_epsilon)},
            "hyperparameters": {k: v for k, v in self.hyperparameters.to_dict().items() if v is not None},
            "schema": self.schema.to_dict(),
            "sites": [s.to_dict() for s in self.sites],
        } | ({} if not self._secagg_section() else {"secure_aggregation": self._secagg_section()}) | (
            {} if self.eval_epsilon is None else
             {"evaluation": {"epsilon": float(self.eval_epsilon), "bins": self.eval_bins}
              | ({} if self.eval_model_sha256 is None else {"model_sha256": self.eval_model_sha256})
              | ({} if self.eval_model_content_sha256 is None else
                 {"model_content_sha256": self.eval_model_content_sha256})
              | ({} if self.eval_residual_clip is None else {"residual_clip": float(self.eval_residual_clip)})})

    def _secagg_section(self) -> dict[str, Any]:
        """[secure_aggregation] without its defaults (a plan that keeps them keeps its hash)."""
        return ({} if self.secagg_graph == "complete" else {"graph": self.secagg_graph,
                                                            "neighbours": self.secagg_neighbours}) | (
            {} if self.secagg_fast_path == "auto" else {"fast_path": self.secagg_fast_path})

    def to_toml(self) -> str:
        from .toml_writer import dumps

        return dumps(self.to_dict(), header=(
            "fedsbdt plan: the public bulletin board of one federated training session.\n"
            f"plan hash (SHA-256 of the canonical form): {self.sha256}\n"
            "Every party recomputes this hash and the privacy numbers below; do not edit one without the other."))

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_toml(), "plan")

    @classmethod
    def from_dict(cls, d: Any, source: str = "plan") -> "Plan":
        """Validate a plan's parsed form; anything malformed is a :class:`PlanError` (a plan may come from a
        hostile coordinator: no other exception may escape to the site or the command line)."""
        try:
            return cls._from_dict(d, source)
        except PlanError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError, RecursionError) as e:
            raise PlanError(f"{source}: malformed plan ({type(e).__name__}: {e})") from None

    @classmethod
    def _from_dict(cls, d: Any, source: str) -> "Plan":
        if not isinstance(d, dict):
            raise PlanError(f"{source}: a plan is a table of sections")
        if d.get("format", FORMAT) != FORMAT or d.get("version", VERSION) != VERSION:
            raise PlanError(f"{source}: not a fedsbdt plan of version {VERSION} "
                            f"(format = {d.get('format')!r}, version = {d.get('version')!r})")
        known = {"format", "version", "session", "deadlines", "privacy", "hyperparameters", "schema", "sites",
                 "evaluation", "secure_aggregation"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PlanError(f"{source}: unknown section(s) {', '.join(unknown)}")

        def section(name: str, required: bool = True) -> dict[str, Any]:
            return _section(d, name, source, required)

        s = dict(section("session"))
        s_known = {"id", "threshold", "assumed_colluders", "dropout_slack", "noise", "epoch_rounds", "max_records_per_site",
                   "max_attempts", "randomness", "sampler", "test_seed", "test_noise"}
        bad = sorted(set(s) - s_known)
        if bad:
            raise PlanError(f"{source}: unknown [session] key(s) {', '.join(bad)}")
        for key in ("id", "threshold"):
            if key not in s:
                raise PlanError(f"{source}: missing session.{key}")
        dl = section("deadlines", required=False)
        bad = sorted(set(dl) - {f.name for f in dataclasses.fields(Deadlines)})
        if bad:
            raise PlanError(f"{source}: unknown [deadlines] key(s) {', '.join(bad)}")
        pr = section("privacy")
        if set(pr) != {"sigma", "epsilon"}:
            raise PlanError(f"{source}: [privacy] must state exactly sigma and epsilon "
                            "(compute them with `fedsbdt plan` or `fedsbdt account`)")
        try:
            hp = Hyperparameters.from_dict(section("hyperparameters"))
        except (ConfigError, TypeError) as e:
            raise PlanError(f"{source}: [hyperparameters]: {e}") from None
        try:
            schema = Schema.from_dict(section("schema"), source=f"{source} [schema]")
        except SchemaError as e:
            raise PlanError(str(e)) from None
        sites = _roster(d.get("sites"), source)
        ev = section("evaluation", required=False)
        bad = sorted(set(ev) - {"epsilon", "bins", "model_sha256", "model_content_sha256", "residual_clip"})
        if bad or (ev and "epsilon" not in ev):
            raise PlanError(f"{source}: [evaluation] takes epsilon (required), bins, residual_clip and model_sha256"
                            + (f"; unknown key(s) {', '.join(bad)}" if bad else ""))
        sa = section("secure_aggregation", required=False)
        bad = sorted(set(sa) - {"graph", "neighbours", "fast_path"})
        if bad:
            raise PlanError(f"{source}: [secure_aggregation] takes graph, neighbours and fast_path; unknown key(s) "
                            f"{', '.join(bad)}")
        try:
            return cls(
                session_id=s["id"], schema=schema, hyperparameters=hp, sites=tuple(sites), threshold=s["threshold"],
                stated_sigma=pr["sigma"], stated_epsilon=pr["epsilon"],
                noise=s.get("noise", "distributed"), assumed_colluders=s.get("assumed_colluders", 0),
                dropout_slack=s.get("dropout_slack", 0),
                epoch_rounds=s.get("epoch_rounds", 64), max_records_per_site=s.get("max_records_per_site", 1_000_000),
                max_attempts=s.get("max_attempts", 20), randomness=s.get("randomness", "secure"),
                sampler=s.get("sampler", "ours"),
                test_seed=s.get("test_seed", 0), test_noise=s.get("test_noise", True), deadlines=Deadlines(**dl),
                eval_epsilon=ev.get("epsilon"), eval_bins=ev.get("bins", 20),
                eval_model_sha256=ev.get("model_sha256"), eval_residual_clip=ev.get("residual_clip"),
                eval_model_content_sha256=ev.get("model_content_sha256"),
                secagg_graph=sa.get("graph", "complete"), secagg_neighbours=sa.get("neighbours", 0),
                secagg_fast_path=sa.get("fast_path", "auto"),
            )
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None

    @classmethod
    def from_toml(cls, text: str, source: str = "plan") -> "Plan":
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PlanError(f"{source}: not valid TOML: {e}") from None
        return cls.from_dict(raw, source)

    @classmethod
    def from_canonical_json(cls, data: bytes, source: str = "plan") -> "Plan":
        """Parse the canonical JSON a coordinator serves; refuses anything that is not exactly canonical."""
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise PlanError(f"{source}: not valid JSON: {e}") from None
        plan = cls.from_dict(raw, source)
        if plan.canonical_json != bytes(data):
            raise PlanError(f"{source}: the served plan is not in canonical form (its bytes and its hash differ "
                            "from the plan they describe)")
        return plan

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlanError(f"plan file not found: {p}") from None
        except (UnicodeDecodeError, IsADirectoryError) as e:
            raise PlanError(f"{p}: not a readable plan file ({e})") from None
        return cls.from_toml(text, source=str(p))


def make_plan(schema: Schema, hp: Hyperparameters, sites: list[SiteEntry], threshold: int | None = None,
              session_id: str = "fedsbdt-session", **session: Any) -> Plan:
    """A plan with the privacy statement computed by this party's accountant (what ``fedsbdt plan`` writes).

    Defaults: t = ⌊n/2⌋ + 1 (or ⌊(n + c)/2⌋ + 1 for a given c), and c = 2t − n − 1, the largest
    number of colluders the threshold rule 2t > n + c allows for that t (common/guarantee.py):
    the guarantee then covers every coalition that secure aggregation itself can resist.
    """
    if hp.seed is None:
        import secrets

        hp = hp.replace(seed=secrets.randbits(63))
    try:
        cal = federated_calibration(hp)
    except AccountingError as e:
        raise PlanError(f"the privacy parameters are impossible: {e}") from None
    n = len(sites)
    c = session.pop("assumed_colluders", None)
    if c is None:  # the most conservative c the threshold allows (docs/threat-model.md)
        t = threshold if threshold is not None else n // 2 + 1
        c = default_colluders(n, t) if isinstance(t, int) and not isinstance(t, bool) else 0
    else:
        t = threshold if threshold is not None else (n + c) // 2 + 1
    plan = Plan(assumed_colluders=c, session_id=session_id, schema=schema, hyperparameters=hp, sites=tuple(sites),
                threshold=t, stated_sigma=cal.sigma, stated_epsilon=cal.epsilon, **session)
    plan.check_release_accounting()  # the ε it states is what its releases are charged
    return plan
