"""Coordinator side of secure aggregation: explicit, transport-free state machines, one module per stage.

:class:`SecAggCoordinator` (:mod:`.facade`) allocates epoch ids and round ids (monotonic, never reused) and
creates one state machine per epoch setup and per round:

* :class:`CoordinatorEpochSetup` (:mod:`.epoch_setup`) — stages ``CollectingAdverts → CollectingShareKeys →
  SetupComplete`` (or ``SetupAborted``): docs/secagg.md's AdvertiseKeys and ShareKeys; the result is a
  :class:`CoordinatorEpoch` (:mod:`.epoch`: public material only), stored as :mod:`.store` describes;
* :class:`CoordinatorRound` (:mod:`.round`) — stages ``CollectingInputs → CollectingSignatures``
  (:mod:`.masked_input`: MaskedInput, Consistency) ``→ CollectingShares`` (:mod:`.unmask`: Unmask) ``→
  RoundComplete`` (or ``RoundFailed``; :mod:`.round_base`); a fast round is ``CollectingFastInputs →
  RoundComplete`` (:mod:`.fast`: one exchange, every participant's masked input and seed shares, finalized
  only when all of P_r sent; docs/secagg.md §6).

``receive_*`` methods validate one site message and either record it or
refuse it with :class:`~fedsbdt.common.secagg.errors.InvalidMessage` (the site is then
treated as silent).  ``close_*`` methods are called by the transport when it
stops waiting (all expected messages in, or a timeout); they move to the next
stage and return the messages to send, or raise
:class:`~fedsbdt.common.secagg.errors.ProtocolAbort` when fewer than ``t`` sites
remain.  :meth:`CoordinatorRound.finalize` reconstructs the needed secrets,
checks every one against its commitment (blaming sites whose shares fail) and
returns the exact int64 sum over the survivor set U3.

By construction the coordinator only ever *accepts* seed shares of U3 members
and mask-key shares of P_r \\ U3 members, so it never holds both unmasking
secrets of one site for one round.
"""
from .epoch import CoordinatorEpoch, StoredRouting
from .epoch_setup import (
    CollectingAdverts,
    CollectingShareKeys,
    CoordinatorEpochSetup,
    SetupAborted,
    SetupComplete,
    SetupStage,
)
from .facade import SecAggCoordinator
from .fast import CollectingFastInputs
from .masked_input import CollectingInputs, CollectingSignatures
from .round import CoordinatorRound
from .round_base import RoundComplete, RoundFailed, RoundResult, RoundStage, remove_masks
from .unmask import CollectingShares, CollectingSharesOnGraph


__all__ = [
    "CollectingAdverts", "CollectingFastInputs", "CollectingInputs", "CollectingShareKeys", "CollectingShares",
    "CollectingSharesOnGraph", "CollectingSignatures", "CoordinatorEpoch", "CoordinatorEpochSetup",
    "CoordinatorRound", "RoundComplete", "RoundFailed", "RoundResult", "RoundStage", "SecAggCoordinator",
    "SetupAborted", "SetupComplete", "SetupStage", "StoredRouting", "remove_masks",
]
