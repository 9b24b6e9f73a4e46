"""The unmasking stage of a round (docs/secagg.md: Unmask): :class:`CollectingShares` (complete graph) and
:class:`CollectingSharesOnGraph` (sparse graph) collect the survivors' shares and reconstruct the secrets; their
``finalize`` returns the round's exact sum."""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter

from ..shamir import PRIME
from ..errors import InvalidMessage, ProtocolAbort
from ..messages import KIND_KEY, KIND_SEED, ConsistencyRequest, MaskedInput, UnmaskRequest, UnmaskResponse
from .round_base import RoundResult, RoundStage


@dataclass
class CollectingShares(RoundStage):
    inputs: dict[str, MaskedInput]
    consistency: ConsistencyRequest
    request: UnmaskRequest
    responses: dict[str, UnmaskResponse] = field(default_factory=dict)
    name = "collecting-shares"

    def receive(self, rnd, msg):
        if not isinstance(msg, UnmaskResponse):
            return super().receive(rnd, msg)
        rnd._check_common(msg)
        req = self.request
        if msg.sender not in req.survivors:
            raise InvalidMessage(f"round {rnd.round_id}: unmask response from non-survivor {msg.sender!r}")
        survivors, dropped = self._expected(rnd, msg.sender)
        if tuple(map(itemgetter(0), msg.seed_shares)) != survivors:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} must reveal seed shares for exactly the survivors")
        if tuple(map(itemgetter(0), msg.key_shares)) != dropped:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} must reveal mask-key shares for exactly the dropped sites")
        prev = self.responses.get(msg.sender)
        if prev is not None and prev != msg:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} sent two different unmask responses")
        self.responses[msg.sender] = msg

    def _expected(self, rnd, sender: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The dealers whose seed shares / mask-key shares ``sender`` must reveal."""
        return self.request.survivors, self.request.dropped

    def finalize(self, rnd) -> RoundResult:
        t = rnd.t
        if len(self.responses) < t:
            raise ProtocolAbort(f"round {rnd.round_id}: only {len(self.responses)} unmask responses, threshold is {t}")
        ep, slot = rnd.epoch, rnd.slot
        holders = sorted(self.responses, key=rnd.config.x_coordinate)
        blamed: set[str] = set()
        seed_tab = {h: dict(self.responses[h].seed_shares) for h in holders}
        key_tab = {h: dict(self.responses[h].key_shares) for h in holders}
        seeds = rnd._recover(self.request.survivors, seed_tab, holders, KIND_SEED, rnd.seed_matches, blamed)
        keys = rnd._recover(self.request.dropped, key_tab, holders, KIND_KEY, rnd.key_matches, blamed)
        u3 = self.request.survivors
        peers = tuple((v, ep.mask_keys[v][slot]) for v in u3)
        total = rnd.unmask([self.inputs[u].masked for u in u3], seeds, {w: (keys[w], peers) for w in self.request.dropped})
        return RoundResult(ep.epoch, rnd.round_id, rnd.participants, u3, self.request.dropped, total, tuple(sorted(blamed)))


@dataclass
class CollectingSharesOnGraph(CollectingShares):
    """Unmask stage on a sparse graph: each holder reveals for its closed neighbourhood only; every secret
    is reconstructed from t_k holders of that dealer's neighbourhood (O(n·k) work instead of O(n²))."""

    name = "collecting-shares"

    def __post_init__(self) -> None:
        self._alive, self._dropped = frozenset(self.request.survivors), frozenset(self.request.dropped)

    def _expected(self, rnd, sender):
        holders = rnd.epoch.graph.holders(sender)  # sorted, like the request's lists: O(k), not O(n)
        return tuple(v for v in holders if v in self._alive), tuple(w for w in holders if w in self._dropped)

    def finalize(self, rnd) -> RoundResult:
        g = rnd.epoch.graph
        ep, slot, r = rnd.epoch, rnd.slot, rnd.round_id
        blamed: set[str] = set()
        seed_tab = {h: dict(m.seed_shares) for h, m in self.responses.items()}
        key_tab = {h: dict(m.key_shares) for h, m in self.responses.items()}
        u3, dropped = self.request.survivors, self.request.dropped
        seeds = _recover_on_graph(rnd, u3, seed_tab, KIND_SEED, rnd.seed_matches, blamed)
        keys = _recover_on_graph(rnd, dropped, key_tab, KIND_KEY, rnd.key_matches, blamed)
        alive = set(u3)
        total = rnd.unmask(
            [self.inputs[u].masked for u in u3], seeds,
            {w: (keys[w], tuple((v, ep.mask_keys[v][slot]) for v in g.neighbours(w) if v in alive)) for w in dropped},
        )
        return RoundResult(ep.epoch, r, rnd.participants, u3, dropped, total, tuple(sorted(blamed)))


def _recover_on_graph(rnd, dealers, table, kind, check, blamed: set[str]) -> dict[str, bytes]:
    """Each dealer's secret from t_k holders of its closed neighbourhood (sparse graph; ``table``: holder →
    dealer → share).  Interpolates from the first t_k holders; on a commitment failure the general recovery
    checks every share, blames bad holders and retries with the valid ones."""
    g, ep, r, x = rnd.epoch.graph, rnd.epoch, rnd.round_id, rnd.config.x_coordinate
    tk = g.threshold
    out: dict[str, bytes] = {}
    for v in dealers:
        holders = sorted((h for h in g.holders(v) if h in table), key=x)
        if len(holders) < tk:
            raise ProtocolAbort(f"round {r}: only {len(holders)} neighbours of {v!r} revealed shares, local threshold is {tk}")
        lam = ep.lagrange(tuple(x(h) for h in holders[:tk]))
        value = sum(c * int.from_bytes(table[h][v], "big") for c, h in zip(lam, holders)) % PRIME
        secret = value.to_bytes(32, "big") if value < 2**256 else b""
        if secret and check(v, secret):
            out[v] = secret
        else:
            out.update(rnd._recover((v,), table, holders, kind, check, blamed, t=tk))
    return out


class _Lazy:
    """A mapping built on first use (the per-holder share tables of the blame path)."""

    def __init__(self, build) -> None:
        self._build, self._table = build, None

    def __getitem__(self, key):
        if self._table is None:
            self._table = self._build()
        return self._table[key]
