"""The only stage of a fast round (docs/secagg.md §6): every participant's masked input with its seed shares,
finalized into the sum only when all of P_r sent."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import filterfalse

from ..shamir import reconstruct_many_packed
from ..errors import InvalidMessage, ProtocolAbort
from ..messages import KIND_SEED, FastMaskedInput
from .round_base import RoundResult, RoundStage, _check_input
from .unmask import _Lazy, _recover_on_graph


@dataclass
class CollectingFastInputs(RoundStage):
    """The only stage of a fast round: each participant's masked input with its seed shares of all of P_r."""

    inputs: dict[str, FastMaskedInput] = field(default_factory=dict)
    name = "collecting-fast-inputs"

    def receive(self, rnd, msg):
        if not isinstance(msg, FastMaskedInput):
            return super().receive(rnd, msg)
        _check_input(rnd, self.inputs, msg, "fast input")
        g = rnd.epoch.graph
        expected = rnd.participants if g is None else rnd._layout(msg.sender).dealers
        if msg.dealers != expected:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} must send seed shares for exactly the participants"
                                 + ("" if g is None else " in its neighbourhood"))
        self.inputs[msg.sender] = msg

    def finalize(self, rnd) -> RoundResult:
        p, r = rnd.participants, rnd.round_id
        missing = list(filterfalse(self.inputs.__contains__, p))
        if missing:  # nobody may drop in a fast round: without their inputs the self-masks would not cancel
            raise ProtocolAbort(f"round {r}: fast round without the inputs of {missing}; nothing is released "
                                "(retry in a new round)")
        blamed: set[str] = set()
        if rnd.epoch.graph is not None:  # a fast-only sparse session: each seed from its neighbourhood's shares
            seeds = _recover_on_graph(rnd, p, {h: dict(self.inputs[h].seed_shares) for h in p}, KIND_SEED,
                                      rnd.seed_matches, blamed)
            total = rnd.unmask([self.inputs[u].masked for u in p], seeds, {})
            return RoundResult(rnd.epoch.epoch, r, p, p, (), total, tuple(sorted(blamed)))
        holders = sorted(p, key=rnd.config.x_coordinate)
        # every reply lists the shares in P_r's order (checked on receipt): the first t holders' share bytes
        # interpolated at once, without a per-holder dict (built only if a share must be blamed)
        xs = [rnd.config.x_coordinate(h) for h in holders[:rnd.t]]
        values = reconstruct_many_packed(xs, [self.inputs[h].share_matrix() for h in holders[:rnd.t]], rnd.t)
        seed_tab = _Lazy(lambda: {h: dict(self.inputs[h].seed_shares) for h in holders})
        seeds = rnd._recover(p, seed_tab, holders, KIND_SEED, rnd.seed_matches, blamed, values=values)
        total = rnd.unmask([self.inputs[u].masked for u in p], seeds, {})
        return RoundResult(rnd.epoch.epoch, r, p, p, (), total, tuple(sorted(blamed)))
