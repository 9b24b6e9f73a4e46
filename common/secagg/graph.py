"""The public neighbourhood graph of sparse secure aggregation (Bell et al., CCS 2020) — pure functions.

In the sparse variant each site masks only with its k neighbours in a public
random k-regular graph over the epoch's roster A1, Shamir-shares its
self-mask seed and mask key only to its closed neighbourhood N[u] (itself and
its k neighbours, K = k + 1 holders) with a *local* threshold t_k, and reveals
after t_k consistency signatures from N[u].  This module holds only the graph
and the threshold rule; the state machines in ``site.py`` / ``coordinator.py``
take a :class:`NeighbourGraph` (``None`` means today's complete graph).

**The graph is not chosen by the coordinator.**  It is a deterministic
function of the epoch digest (SHA-256 of the EpochRoster, i.e. of every
accepted advertisement with each site's fresh keys) and of k; every site
recomputes it from the roster it signed over and the coordinator computes the
same, so nobody can be shown another graph without changing the epoch digest
(which is bound into every share encryption, commitment and signature).

Construction (:func:`epoch_graph`): a seeded AES-256-CTR stream
(key = SHA-256(label("graph") ‖ epoch digest ‖ u32(k))) drives (1) the
Steger–Wormald pairing algorithm, which yields a random simple k-regular graph
(asymptotically uniform), and (2) a uniformly random relabelling of its
vertices (Fisher–Yates).  Because of (2) the neighbour set of any fixed site
is *exactly* a uniform random k-subset of the other sites, whatever the
pairing's small bias — which is what the threshold rule below needs.  If
k ≥ |A1| − 1 the graph is complete.

Threshold rule (:func:`local_threshold`): with at most c colluding sites, fixed
before the epoch digest is known, the number of colluders among an honest
site's k neighbours is hypergeometric (population n − 1, c marked, k draws).
c_k is the smallest bound with ``(n − c) · P[X > c_k] ≤ 2^-σ`` (a union bound
over the honest sites; σ = ``security_bits``), and t_k = ⌊(K + c_k)/2⌋ + 1, the
per-neighbourhood version of the session rule 2t > n + c.  With the complete
graph this gives c_k = c and t_k = ⌊(n + c)/2⌋ + 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from .errors import ConfigError
from .primitives import label, prg_expand, sha256, u32

LABEL_GRAPH = b"graph"
#: default σ of the threshold rule: the per-epoch probability that some honest neighbourhood
#: holds more than c_k colluders is at most 2^-σ (see the module docstring and docs/secagg.md §10)
DEFAULT_SECURITY_BITS = 40
_CHUNK = 512  # uint64 values per PRG block


class _Stream:
    """Deterministic uniform integers from AES-256-CTR blocks keyed by a seed (not a secret: public coins)."""

    def __init__(self, seed: bytes) -> None:
        self._seed = seed
        self._block = 0
        self._buf: list[int] = []

    def _next(self) -> int:
        if not self._buf:
            key = sha256(self._seed, u32(self._block))
            self._block += 1
            self._buf = [int(x) for x in prg_expand(key, _CHUNK)][::-1]
        return self._buf.pop()

    def below(self, m: int) -> int:
        """Uniform integer in [0, m) by rejection (no modulo bias)."""
        limit = (1 << 64) - ((1 << 64) % m)
        while True:
            x = self._next()
            if x < limit:
                return x % m


def _steger_wormald(n: int, k: int, rng: _Stream) -> list[set[int]]:
    """A random simple k-regular graph on 0…n−1 (Steger & Wormald 1999): pair random points, restart if stuck."""
    while True:
        points = [v for v in range(n) for _ in range(k)]
        adj: list[set[int]] = [set() for _ in range(n)]
        stuck = False
        while points:
            tries = 0
            while True:
                a, b = rng.below(len(points)), rng.below(len(points))
                u, v = points[a], points[b]
                if u != v and v not in adj[u]:
                    break
                tries += 1
                if tries > 64 and not any(
                    x != y and y not in adj[x] for i, x in enumerate(points) for y in points[i + 1 :]
                ):
                    stuck = True
                    break
            if stuck:
                break
            adj[u].add(v)
            adj[v].add(u)
            for i in sorted((a, b), reverse=True):
                points[i] = points[-1]
                points.pop()
        if not stuck:
            return adj


@dataclass(frozen=True)
class NeighbourGraph:
    """A public undirected graph over an epoch's roster with its local threshold.

    ``adjacency[u]`` is u's open neighbourhood N(u) (sorted ids); :meth:`holders`
    gives the closed neighbourhood N[u] = N(u) ∪ {u}, the sites that hold
    shares of u's secrets and whose signatures u counts.
    """

    members: tuple[str, ...]
    adjacency: dict[str, tuple[str, ...]]
    threshold: int  # t_k: shares needed to reconstruct a secret; signatures a site needs to reveal
    colluder_bound: int  # c_k: colluders per neighbourhood the threshold tolerates
    failure_bound: float  # upper bound on P[some honest neighbourhood holds more than c_k colluders]

    @property
    def degree(self) -> int:
        return len(self.adjacency[self.members[0]]) if self.members else 0

    def neighbours(self, site: str) -> tuple[str, ...]:
        return self.adjacency[site]

    def holders(self, site: str) -> tuple[str, ...]:
        """N[site]: the sorted closed neighbourhood."""
        return self._closed[site]

    def adjacent(self, u: str, v: str) -> bool:
        return v in self._sets[u]

    def is_neighbour_or_self(self, u: str, v: str) -> bool:
        return u == v or v in self._sets[u]

    @cached_property
    def _sets(self) -> dict[str, frozenset[str]]:
        return {u: frozenset(vs) for u, vs in self.adjacency.items()}

    @cached_property
    def _closed(self) -> dict[str, tuple[str, ...]]:
        return {u: tuple(sorted((*vs, u))) for u, vs in self.adjacency.items()}


def hypergeometric_tail(population: int, marked: int, draws: int, above: int) -> float:
    """P[X > above] for X ~ Hypergeometric(population, marked, draws), exact (rational → float)."""
    total = math.comb(population, draws)
    hi = min(marked, draws)
    num = sum(math.comb(marked, x) * math.comb(population - marked, draws - x) for x in range(above + 1, hi + 1))
    return num / total


@dataclass(frozen=True)
class LocalThreshold:
    """Outcome of the threshold rule for one roster size."""

    degree: int  # k actually used (min(k, n − 1))
    threshold: int  # t_k
    colluder_bound: int  # c_k
    failure_bound: float  # (n − c) · P[X > c_k]


def local_threshold(n: int, k: int, colluders: int, security_bits: int = DEFAULT_SECURITY_BITS) -> LocalThreshold:
    """t_k for a k-regular graph on n sites with at most ``colluders`` colluding (module docstring)."""
    if n < 2:
        raise ConfigError("a neighbourhood graph needs at least 2 sites")
    k = min(k, n - 1)
    c = min(colluders, n)
    honest = max(n - c, 0)
    bound = 2.0 ** -security_bits
    ck, fail = min(c, k), 0.0
    for cand in range(0, min(c, k) + 1):
        p = honest * hypergeometric_tail(n - 1, c, k, cand)
        if p <= bound:
            ck, fail = cand, p
            break
    return LocalThreshold(k, (k + 1 + ck) // 2 + 1, ck, fail)


def check_sparse_parameters(n: int, k: int, colluders: int, security_bits: int = DEFAULT_SECURITY_BITS) -> LocalThreshold:
    """Validate a sparse-graph setting for a roster of n sites; returns its threshold (ConfigError if unusable)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ConfigError(f"neighbours must be an integer ≥ 2, got {k!r}")
    if k % 2:
        raise ConfigError(f"neighbours must be even (a k-regular graph on an odd number of sites needs even k), got {k}")
    if k >= n - 1:
        raise ConfigError(f"neighbours = {k} is not below n − 1 = {n - 1}: use the complete graph (graph = \"complete\")")
    lt = local_threshold(n, k, colluders, security_bits)
    if lt.threshold > k:
        raise ConfigError(
            f"neighbours = {k} is too small for {n} sites with {colluders} assumed colluders: a neighbourhood of "
            f"{k + 1} may hold up to {lt.colluder_bound} colluders (failure ≤ 2^-{security_bits}), so the local threshold "
            f"would be t_k = {lt.threshold} > k and no neighbour could drop out; choose a larger even k"
        )
    return lt


def suggested_neighbours(n: int) -> int:
    """A documented default k: the even number 2·⌈2·log2 n⌉ (tens of neighbours for n ≤ 1,000, as in Bell et al.).

    This only sets how well-connected the graph is; soundness comes from the threshold rule,
    which :func:`check_sparse_parameters` enforces for whatever k is chosen.
    """
    return 2 * math.ceil(2 * math.log2(max(n, 2)))


def graph_seed(epoch_digest: bytes, k: int) -> bytes:
    return sha256(label(LABEL_GRAPH), epoch_digest, u32(k))


def epoch_graph(
    epoch_digest: bytes, members: tuple[str, ...], k: int, colluders: int, security_bits: int = DEFAULT_SECURITY_BITS
) -> NeighbourGraph:
    """The graph of one epoch: a deterministic function of the epoch digest, the sorted roster A1 and k."""
    members = tuple(sorted(members))
    n = len(members)
    if n < 2:
        raise ConfigError("a neighbourhood graph needs at least 2 sites")
    lt = local_threshold(n, k, colluders, security_bits)
    kk = lt.degree
    if kk >= n - 1:
        adj = {u: tuple(v for v in members if v != u) for u in members}
        return NeighbourGraph(members, adj, lt.threshold, lt.colluder_bound, lt.failure_bound)
    if (n * kk) % 2:
        kk -= 1  # an odd roster with odd k: one neighbour fewer (k is even in validated settings)
        lt = local_threshold(n, kk, colluders, security_bits)
    rng = _Stream(graph_seed(epoch_digest, kk))
    adj_idx = _steger_wormald(n, kk, rng)
    perm = list(range(n))
    for i in range(n - 1, 0, -1):  # Fisher–Yates: vertex i of the pairing becomes members[perm[i]]
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    adj = {members[perm[i]]: tuple(sorted(members[perm[j]] for j in adj_idx[i])) for i in range(n)}
    return NeighbourGraph(members, adj, lt.threshold, lt.colluder_bound, lt.failure_bound)

