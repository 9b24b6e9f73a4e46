"""Session parameters shared by every party: roster, threshold, limits, session digest.

The roster (site ids with their pinned Ed25519 identity keys) and the
threshold ``t`` come from the plan.  Every party derives the same
*session digest* from them::

    SHA-256( label("session") ‖ lp(session_id) ‖ u32(t) ‖ u32(n)
             ‖ for each site in id order: lp(site_id) ‖ lp(identity_key) )

and binds it into every KDF, every AEAD associated data, every signature and
every message, so material from another session, roster or threshold is
refused.

Threshold semantics (secagg.md): the coordinator together with fewer than
``t`` colluding sites learns only sums over at least ``t`` inputs.  We require
``2t > n + c`` where ``c`` (``assumed_colluders``, default 0) is the number of
sites that may collude with a malicious coordinator: then two different
survivor sets can never both collect ``t`` consistency signatures from honest
sites, which is what prevents a lying coordinator from obtaining both
unmasking shares of one site.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..fixedpoint import FixedPointError, check_capacity, noise_tail
from .encoding import MAX_EPOCH_ROUNDS, MAX_SITES, MAX_VECTOR_LEN, check_site_id
from .errors import ConfigError, InvalidMessage
from .graph import DEFAULT_SECURITY_BITS, LocalThreshold, NeighbourGraph, check_sparse_parameters, epoch_graph
from .primitives import KEY_SIZE, LABEL_SESSION, label, lp, sha256, u32

LABEL_GRAPH_PARAMS = b"graph-params"
LABEL_FAST_ONLY = b"fast-only"


@dataclass(frozen=True)
class SiteIdentity:
    """A roster entry: site id and its pinned raw 32-byte Ed25519 public key."""

    site_id: str
    public_key: bytes

    def __post_init__(self) -> None:
        try:
            check_site_id(self.site_id)
        except InvalidMessage as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(self.public_key, bytes) or len(self.public_key) != KEY_SIZE:
            raise ConfigError(f"identity key of {self.site_id!r} must be {KEY_SIZE} raw bytes")


def session_digest(session_id: bytes, threshold: int, roster: Iterable[SiteIdentity]) -> bytes:
    """SHA-256 of the canonical, length-prefixed session parameters (see module docstring)."""
    entries = sorted(roster, key=lambda s: s.site_id)
    parts = [label(LABEL_SESSION), lp(session_id), u32(threshold), u32(len(entries))]
    for s in entries:
        parts.append(lp(s.site_id.encode()))
        parts.append(lp(s.public_key))
    return sha256(*parts)


@dataclass(frozen=True)
class SessionConfig:
    """Everything the parties must agree on before the first epoch.

    Attributes:
        session_id: opaque id of the training session (e.g. the plan hash), ≤ 256 bytes.
        threshold: ``t``; minimum number of sites at every stage.
        roster: the sites and their identity keys (any order; stored sorted by id).
        assumed_colluders: ``c`` sites that may collude with a malicious coordinator;
            the constructor requires ``2t > n + c``.
        max_abs_input: if set, each site refuses an input with an entry of larger
            magnitude (secure aggregation validates nothing else about inputs), and
            the constructor checks ``n·(max_abs_input + noise tail) < 2^63``.
        noise_sigma_units: std of one site's noise share in fixed-point units (for the
            capacity check and for the range check of a noise share passed to a site).
        max_epoch_rounds: largest number of round slots one epoch may announce.
        max_vector_len: largest vector length one round may announce.
        graph: ``"complete"`` (every site masks with every other, Bonawitz et al.) or ``"sparse"``
            (each site masks with ``neighbours`` sites of a public random regular graph per epoch,
            Bell et al.; see ``graph.py`` and docs/secagg.md §10).
        neighbours: k, the degree of the sparse graph (even, below n − 1); ignored for ``"complete"``.
        graph_security_bits: σ of the sparse graph's local-threshold rule.
        fast_only: a sparse session whose every round is fast (docs/secagg.md §10 "Fast-only sessions"):
            sites refuse the signed path for the whole session, so no mask-key share is ever revealed and
            fast rounds are sound on the graph.  Only with ``graph="sparse"``; bound into the digest.
    """

    session_id: bytes
    threshold: int
    roster: tuple[SiteIdentity, ...]
    assumed_colluders: int = 0
    max_abs_input: int | None = None
    noise_sigma_units: float = 0.0
    max_epoch_rounds: int = 256
    max_vector_len: int = 1 << 16
    graph: str = "complete"
    neighbours: int = 0
    graph_security_bits: int = DEFAULT_SECURITY_BITS
    fast_only: bool = False
    _index: dict = field(init=False, repr=False, compare=False, default=None)  # type: ignore[assignment]
    _graphs: dict = field(init=False, repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, bytes) or not 1 <= len(self.session_id) <= 256:
            raise ConfigError("session_id must be 1-256 bytes")
        roster = tuple(sorted(self.roster, key=lambda s: s.site_id))
        object.__setattr__(self, "roster", roster)
        n = len(roster)
        ids = [s.site_id for s in roster]
        if len(set(ids)) != n:
            raise ConfigError("roster lists a site id twice")
        if len({s.public_key for s in roster}) != n:
            raise ConfigError("roster lists one identity key for two sites")
        if not 2 <= n <= MAX_SITES:
            raise ConfigError(f"roster must have between 2 and {MAX_SITES} sites, got {n}")
        t, c = self.threshold, self.assumed_colluders
        if not isinstance(t, int) or not isinstance(c, int) or c < 0:
            raise ConfigError("threshold and assumed_colluders must be non-negative integers")
        if not t <= n:
            raise ConfigError(f"threshold t={t} exceeds the roster size n={n}")
        if not 2 * t > n + c:
            raise ConfigError(
                f"threshold t={t} too low for n={n} sites and {c} assumed colluders: "
                f"secure aggregation requires 2t > n + colluders (here t ≥ {(n + c) // 2 + 1})"
            )
        if not 1 <= self.max_epoch_rounds <= MAX_EPOCH_ROUNDS:
            raise ConfigError(f"max_epoch_rounds must be in [1, {MAX_EPOCH_ROUNDS}]")
        if not 1 <= self.max_vector_len <= MAX_VECTOR_LEN:
            raise ConfigError(f"max_vector_len must be in [1, {MAX_VECTOR_LEN}]")
        if not (math.isfinite(self.noise_sigma_units) and self.noise_sigma_units >= 0):
            raise ConfigError("noise_sigma_units must be a finite non-negative number")
        if self.max_abs_input is not None:
            if not isinstance(self.max_abs_input, int) or self.max_abs_input < 0:
                raise ConfigError("max_abs_input must be a non-negative integer")
            try:
                check_capacity(self.max_abs_input, n, self.noise_sigma_units)
            except FixedPointError as exc:
                raise ConfigError(str(exc)) from None
        if self.graph not in ("complete", "sparse"):
            raise ConfigError(f"graph must be \"complete\" or \"sparse\", got {self.graph!r}")
        if self.graph == "sparse":
            if not isinstance(self.graph_security_bits, int) or not 1 <= self.graph_security_bits <= 256:
                raise ConfigError("graph_security_bits must be an integer in [1, 256]")
            check_sparse_parameters(n, self.neighbours, c, self.graph_security_bits)
        if not isinstance(self.fast_only, bool):
            raise ConfigError("fast_only must be True or False")
        if self.fast_only and self.graph != "sparse":
            raise ConfigError("fast_only is a sparse-graph option (the complete graph mixes fast and signed rounds "
                              "safely, docs/secagg.md §6)")
        object.__setattr__(self, "_index", {sid: i for i, sid in enumerate(ids)})
        object.__setattr__(self, "_graphs", {})

    # ------------------------------------------------------------------ derived values
    @property
    def n(self) -> int:
        return len(self.roster)

    @cached_property
    def digest(self) -> bytes:
        """The session digest bound into every key, AD, signature and message.

        A sparse graph's parameters are bound too (appended, so complete-graph digests are unchanged), and a
        fast-only session's flag after them (so the other sparse digests are unchanged too).
        """
        base = session_digest(self.session_id, self.threshold, self.roster)
        if self.graph == "complete":
            return base
        params = (u32(self.neighbours), u32(self.graph_security_bits), u32(self.assumed_colluders))
        return sha256(label(LABEL_GRAPH_PARAMS), base, *params, *((label(LABEL_FAST_ONLY),) if self.fast_only else ()))

    @property
    def sparse(self) -> bool:
        return self.graph == "sparse"

    @cached_property
    def local_threshold(self) -> LocalThreshold | None:
        """The sparse graph's threshold rule on the full roster (None for the complete graph)."""
        if not self.sparse:
            return None
        return check_sparse_parameters(self.n, self.neighbours, self.assumed_colluders, self.graph_security_bits)

    def epoch_graph(self, roster) -> NeighbourGraph | None:
        """The public graph of an epoch (from its EpochRoster A1); None means the complete graph."""
        if not self.sparse:
            return None
        edig = roster.epoch_digest()
        g = self._graphs.get(edig)
        if g is None:
            g = epoch_graph(edig, roster.senders, self.neighbours, self.assumed_colluders, self.graph_security_bits)
            if len(self._graphs) >= 8:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[edig] = g
        return g

    @cached_property
    def site_ids(self) -> tuple[str, ...]:
        return tuple(s.site_id for s in self.roster)

    @cached_property
    def _keys(self) -> dict[str, Ed25519PublicKey]:
        return {s.site_id: Ed25519PublicKey.from_public_bytes(s.public_key) for s in self.roster}

    def identity_key(self, site_id: str) -> Ed25519PublicKey:
        """Pinned Ed25519 identity key of a roster site."""
        try:
            return self._keys[site_id]
        except KeyError:
            raise InvalidMessage(f"site {site_id!r} is not in the roster") from None

    def x_coordinate(self, site_id: str) -> int:
        """Shamir x-coordinate of a site: its 1-based position in the sorted roster."""
        try:
            return self._index[site_id] + 1
        except KeyError:
            raise InvalidMessage(f"site {site_id!r} is not in the roster") from None

    def in_roster(self, site_id: str) -> bool:
        return site_id in self._index

    @property
    def noise_bound(self) -> int | None:
        """Largest accepted magnitude of a noise-share entry (None: no noise configured)."""
        return noise_tail(self.noise_sigma_units) if self.noise_sigma_units > 0 else None
