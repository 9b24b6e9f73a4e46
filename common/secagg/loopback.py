"""In-process reference transport: drives a coordinator and sites through whole epochs and rounds.

It is the smallest correct "transport": every message crosses as its
canonical bytes (``to_bytes`` → ``decode_message``), every hop is appended to
``transcript``, and dropouts are simulated by not delivering to (or not
collecting from) chosen sites at chosen stages.  Tests, the benchmark and the
docs walkthrough use it; a gRPC layer does the same with network calls and
timeouts instead of sets of dropped sites.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .config import SessionConfig
from .coordinator import CoordinatorEpoch, RoundResult, SecAggCoordinator
from .messages import Message, decode_message
from .site import SecAggSite
from .storage import MemoryStorage, Storage

COORDINATOR = "<coordinator>"


@dataclass
class Hop:
    """One message on the wire."""

    sender: str
    recipient: str
    data: bytes

    @property
    def message(self) -> Message:
        return decode_message(self.data)


@dataclass
class LoopbackFederation:
    """A coordinator and its sites wired together in memory.

    Args:
        config: session parameters.
        identities: site id → Ed25519 private key for every roster site.
        storages: optional site id → storage (defaults to fresh MemoryStorage).
        randbytes: randomness source for all sites (``os.urandom`` unless testing).
    """

    config: SessionConfig
    identities: Mapping[str, Ed25519PrivateKey]
    storages: dict[str, Storage] = field(default_factory=dict)
    randbytes: Callable[[int], bytes] = os.urandom
    coordinator_storage: Storage | None = None

    def __post_init__(self) -> None:
        self.coordinator = SecAggCoordinator(self.config, self.coordinator_storage)
        self.sites: dict[str, SecAggSite] = {}
        for sid in self.config.site_ids:
            self.storages.setdefault(sid, MemoryStorage())
            self.sites[sid] = SecAggSite(self.config, sid, self.identities[sid], self.storages[sid], self.randbytes)
        self.transcript: list[Hop] = []

    # ---------------------------------------------------------------- wire
    def _wire(self, sender: str, recipient: str, msg: Message) -> Message:
        data = msg.to_bytes()
        self.transcript.append(Hop(sender, recipient, data))
        return decode_message(data)

    def to_site(self, site: str, msg: Message, value=None, noise=None) -> Message | None:
        """Deliver a coordinator message to a site; the site's reply (if any) crosses back as bytes."""
        reply = self.sites[site].handle(self._wire(COORDINATOR, site, msg), value, noise)
        return None if reply is None else self._wire(site, COORDINATOR, reply)

    def ask(self, site: str, msg: Message, value=None, noise=None) -> bytes | None:
        """:meth:`to_site`, the reply as the coordinator's transport hands it over: its bytes (a round decodes
        them itself, a fast round's replies in bulk)."""
        return None if self.to_site(site, msg, value, noise) is None else self.transcript[-1].data

    def restart_site(self, site: str) -> SecAggSite:
        """Replace a site object by a fresh one on the same storage (simulates a process restart)."""
        self.sites[site] = SecAggSite(self.config, site, self.identities[site], self.storages[site], self.randbytes)
        return self.sites[site]

    # ---------------------------------------------------------------- epoch
    def run_epoch(
        self,
        num_rounds: int,
        drop_before_advertise: Iterable[str] = (),
        drop_before_share: Iterable[str] = (),
        drop_before_ready: Iterable[str] = (),
        sites: Iterable[str] | None = None,
    ) -> CoordinatorEpoch:
        """One epoch setup; sites in a ``drop_*`` set vanish before that stage (for this epoch)."""
        gone = set(self.coordinator.excluded)
        active = [s for s in (sites if sites is not None else self.config.site_ids) if s not in gone]
        setup, ann = self.coordinator.begin_epoch(num_rounds)
        gone |= set(drop_before_advertise)
        for s in active:
            if s not in gone:
                setup.receive_advertise(self.to_site(s, ann))
        roster = setup.close_advertise()
        gone |= set(drop_before_share)
        for s in roster.senders:
            if s not in gone:
                setup.receive_share_keys(self.to_site(s, roster))
        routed = setup.close_share_keys()
        gone |= set(drop_before_ready)
        for s, msg in routed.items():
            if s not in gone:
                self.to_site(s, msg)
        return self.coordinator.epoch(ann.epoch)

    # ---------------------------------------------------------------- round
    def run_round(
        self,
        inputs: Mapping[str, np.ndarray],
        vector_len: int,
        participants: Iterable[str] | None = None,
        drop_before_input: Iterable[str] = (),
        drop_before_consistency: Iterable[str] = (),
        drop_before_unmask: Iterable[str] = (),
        noise: Mapping[str, np.ndarray] | None = None,
        fast: bool = False,
    ) -> RoundResult:
        """One round; returns the coordinator's result (raises ProtocolAbort if < t remain).

        ``fast=True`` runs a fast round (one exchange): it raises ProtocolAbort if any participant is in
        ``drop_before_input``; the later drop sets do not apply (there are no later stages).
        """
        rnd, start = self.coordinator.begin_round(
            vector_len, None if participants is None else tuple(participants), fast=fast)
        self.last_round = rnd
        gone = set(drop_before_input)
        for s in start.participants:
            if s not in gone:
                rnd.receive(self.ask(s, start, inputs[s], None if noise is None else noise.get(s)))
        if fast:
            return rnd.finalize()
        creq = rnd.close_inputs()
        gone |= set(drop_before_consistency)
        for s in creq.survivors:
            if s not in gone:
                rnd.receive(self.ask(s, creq))
        ureq = rnd.close_consistency()
        gone |= set(drop_before_unmask)
        for s, _ in ureq.signatures:
            if s not in gone:
                rnd.receive(self.ask(s, ureq))
        return rnd.finalize()
