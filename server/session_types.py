"""What the coordinator session's stages share: the events they emit (:data:`Outgoing`), a refused message
(:class:`Rejected`), a site's bookkeeping (:class:`SiteState`) and a work item (:class:`Work`)."""
from __future__ import annotations

from dataclasses import dataclass

from fedsbdt.common.federation.wire import Event, Purpose

Outgoing = tuple[str, Event]


class Rejected(Exception):
    """A site's message was refused; the state did not change.  The transport reports ``str(e)``."""


@dataclass
class SiteState:
    site_id: str
    token: bytes | None = None
    joins: int = 0
    connected: bool = False
    trees_applied: int = 0
    released_at_join: int = 0
    suspended_from_epoch: int | None = None  # usable again only in epochs with id ≥ this
    wants_epoch: bool = False  # joined/suspended since it was last announced an epoch
    finished_sha256: str | None = None
    note: str = ""

    def caught_up(self) -> bool:
        return self.trees_applied >= self.released_at_join


@dataclass(frozen=True)
class Work:
    purpose: Purpose
    tree: int = 0
    level: int = 0  # Purpose.LEVEL: the level of tree ``tree`` whose histograms are summed

    def __str__(self) -> str:
        if self.purpose == Purpose.LEVEL:
            return f"tree {self.tree} level {self.level}"
        if self.purpose == Purpose.SKETCH:
            return f"tree {self.tree} sketch"
        if self.purpose == Purpose.EVAL:
            return "evaluation"
        return "initial score" if self.purpose == Purpose.INIT_SCORE else f"tree {self.tree}"
