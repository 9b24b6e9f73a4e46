"""Exception types of the secure-aggregation protocol.

Every failure the protocol can detect is raised as a subclass of
:class:`SecAggError` with a message a human can act on.  The split matters to a
transport:

* :class:`InvalidMessage` — the bytes or the message are malformed, not
  authentic (bad signature, failed AEAD, wrong session digest) or do not fit
  the current state.  The receiving state machine is **unchanged**; the
  message is simply refused (the sender may be faulty, or the data corrupted
  in transit).
* :class:`OutOfOrder` (an :class:`InvalidMessage`) — a well-formed message for
  a stage the state machine is not in.
* :class:`ReplayError` (an :class:`InvalidMessage`) — a message for an old
  or already-used epoch/round, or one that contradicts what this party has
  already persisted for that round.
* :class:`ProtocolAbort` — the protocol cannot continue safely for this
  epoch or round: fewer than ``t`` parties remain, or the coordinator sent
  well-formed but inconsistent or dishonest instructions.  The affected
  epoch/round moves to its *aborted* stage and never reveals anything more.
* :class:`ConfigError` — invalid session parameters (roster, threshold, limits).
* :class:`StorageError` — the caller's storage failed or returned corrupt data.
"""
from __future__ import annotations


class SecAggError(Exception):
    """Base class of every secure-aggregation error."""


class ConfigError(SecAggError, ValueError):
    """Invalid session configuration (roster, threshold, limits)."""


class InvalidMessage(SecAggError):
    """A message is malformed, unauthentic, or does not fit the current state; it was refused."""


class OutOfOrder(InvalidMessage):
    """A message arrived for a stage the state machine is not in."""


class ReplayError(InvalidMessage):
    """A message refers to an old/used epoch or round, or contradicts persisted state."""


class ProtocolAbort(SecAggError):
    """The epoch or round cannot continue safely; it has been aborted.

    ``blame`` lists site ids that were identified as the cause, when known
    (for example a site whose revealed share fails its commitment).
    """

    def __init__(self, message: str, blame: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.blame = tuple(blame)


class StorageError(SecAggError):
    """The caller-provided storage failed or holds data this code cannot read."""
