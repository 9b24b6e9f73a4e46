"""Numba kernels of the S-BDT engine behind a small numpy API.

Trees are complete binary trees of depth d stored in heap order: inner node
k has children 2k+1 (left) and 2k+2 (right); leaf ℓ is node ℓ + 2^d − 1.
A record goes left at a numeric node iff ``x[f] < threshold`` and at a
categorical node iff ``x[f] == level`` (one level against the rest).

All kernels are pure: they read their inputs and return fresh arrays.
Compilation is cached on disk (``cache=True``).

Performance notes (results never depend on which path runs):

* Tree walks are branchless and interleave :data:`BLOCK` records, so the
  CPU overlaps their dependency chains (``node → feature → x → compare``)
  instead of stalling on one record at a time.  Numeric and categorical
  nodes share one test: a record goes left iff ``lo ≤ x < hi`` with
  ``(lo, hi) = (−inf, t)`` for ``x < t`` and ``(l, nextafter(l, +inf))``
  for ``x == l`` (see :func:`node_bounds`).  Feature matrices larger than
  :data:`STREAMING_BYTES` are walked one record at a time with branches
  instead: there, speculation past the branches is what prefetches rows.
* With a finite public set of candidate thresholds per feature
  (``split_candidates > 0``) the records can be coded once as small
  integers (:func:`bin_codes`): ``x < c_j ⟺ code(x) < j + 1`` exactly, so
  trees are walked on one byte per value (:func:`leaf_index_codes`), and a
  tree whose inner nodes all test the same feature (cyclical trees) becomes
  a 256-entry table lookup.
* :func:`round_sums` fuses gradient/Hessian computation, the individual
  filter and the leaf-sum accumulation in one pass; without the filter it
  computes gradients for the subsampled records only.
* Greedy trees' level histograms (routing fused in), the gradients, the
  leaf walk and the leaf sums run over chunks of records in parallel
  (``prange``), each chunk into its own sums: exact integers or per-record
  maps, so no result depends on the chunks or their order.  Data of one chunk
  (:func:`parallel_chunks`) runs each kernel's serial twin and wakes no thread.
"""
from __future__ import annotations

import os

import numpy as np

from .numba_lazy import njit, prange  # numba is imported at the first call of a kernel

REGRESSION, BINARY = 0, 1

# The parallel kernels' OpenMP threads sleep between kernels instead of spinning: a busy machine (site
# processes, a test suite) otherwise makes them slower than one thread.  A value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: records walked together by the interleaved tree walks
BLOCK = 8
#: feature matrices above this size are walked with the streaming (branchy) kernel
STREAMING_BYTES = 32 << 20
#: code of a categorical value that is not a level index 0..254 (matches no node)
NO_LEVEL = 255
_U1 = np.uint64(1)
_U2 = np.uint64(2)


@njit(cache=True, nogil=True, inline="always")
def _walk_chunk(t, chunks, M, features, lo, hi, depth, out):
    """Chunk t of :func:`_walk_blocked`'s blocks (the last chunk also walks the records past the last block)."""
    n = M.shape[0]
    first = (1 << depth) - 1
    nb = n // BLOCK
    per = (nb + chunks - 1) // chunks
    ks = np.zeros(BLOCK, dtype=np.uint64)
    for b in range(t * per, min(nb, (t + 1) * per)):
        base = b * BLOCK
        for j in range(BLOCK):
            ks[j] = 0
        for _ in range(depth):
            for j in range(BLOCK):
                k = ks[j]
                x = M[np.uint64(base + j), np.uint64(features[k])]
                left = (x >= lo[k]) & (x < hi[k])
                ks[j] = _U2 * k + _U2 - np.uint64(left)
        for j in range(BLOCK):
            out[base + j] = np.int32(ks[j]) - first
    if t == chunks - 1:
        for i in range(nb * BLOCK, n):
            k = 0
            for _ in range(depth):
                x = M[i, features[k]]
                left = (x >= lo[k]) & (x < hi[k])
                k = 2 * k + 2 - (1 if left else 0)
            out[i] = k - first


@njit(cache=True, nogil=True, parallel=True)
def _walk_blocked_parallel(M, features, lo, hi, depth, chunks, out):
    for t in prange(chunks):
        _walk_chunk(t, chunks, M, features, lo, hi, depth, out)


@njit(cache=True, nogil=True)
def _walk_blocked_one(M, features, lo, hi, depth, out):
    _walk_chunk(0, 1, M, features, lo, hi, depth, out)


def _walk_blocked(M, features, lo, hi, depth: int) -> np.ndarray:
    """Leaf of every row of ``M`` (row i, column f = feature f): left iff ``lo[k] <= M[i, f] < hi[k]``, runs of
    whole blocks walked in parallel where there are several (:func:`parallel_chunks`)."""
    out = np.empty(M.shape[0], dtype=np.int32)
    chunks = parallel_chunks(M.shape[0])
    if chunks > 1:
        _walk_blocked_parallel(M, features, lo, hi, depth, chunks, out)
    else:  # one chunk: no threads to wake
        _walk_blocked_one(M, features, lo, hi, depth, out)
    return out


@njit(cache=True, nogil=True)
def _walk_table(lo, hi, depth, size):
    """Leaf reached by each code value 0 … size−1 in a tree whose nodes all test one feature."""
    out = np.empty(size, dtype=np.int32)
    first = (1 << depth) - 1
    for c in range(size):
        k = 0
        for _ in range(depth):
            left = (c >= lo[k]) & (c < hi[k])
            k = 2 * k + 2 - (1 if left else 0)
        out[c] = k - first
    return out


@njit(cache=True, nogil=True)
def _lookup(codes, table):
    n = codes.shape[0]
    out = np.empty(n, dtype=np.int32)
    for i in range(n):
        out[i] = table[codes[i]]
    return out


def node_bounds(features: np.ndarray, thresholds: np.ndarray, is_cat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per inner node ``(lo, hi)`` with "goes left" ⟺ ``lo ≤ x < hi`` for every float x (NaN goes right).

    Numeric ``x < t``: ``(−inf, t)``.  Categorical ``x == l``: ``(l, nextafter(l, +inf))``.
    """
    features = np.asarray(features, np.int64)
    thresholds = np.asarray(thresholds, np.float64)
    cat = np.asarray(is_cat, np.bool_)[features]
    lo = np.where(cat, thresholds, -np.inf)
    hi = np.where(cat, np.nextafter(thresholds, np.inf), thresholds)
    return lo, hi


@njit(cache=True, nogil=True)
def _leaf_index(X, features, thresholds, is_cat, depth):
    n = X.shape[0]
    out = np.empty(n, dtype=np.int32)
    first_leaf = (1 << depth) - 1
    for i in range(n):
        k = 0
        for _ in range(depth):
            f = features[k]
            x = X[i, f]
            if is_cat[f]:
                right = x != thresholds[k]
            else:
                right = not (x < thresholds[k])
            k = 2 * k + 1 + (1 if right else 0)
        out[i] = k - first_leaf
    return out


@njit(cache=True, nogil=True)
def _walk_default(X, features, lo, hi, default_left, depth):
    """Leaf of every row: left iff ``lo[k] <= x < hi[k]``, or x is NaN (missing) and ``default_left[k]``."""
    n = X.shape[0]
    out = np.empty(n, dtype=np.int32)
    first = (1 << depth) - 1
    for i in range(n):
        k = 0
        for _ in range(depth):
            x = X[i, features[k]]
            left = ((x >= lo[k]) & (x < hi[k])) | ((x != x) & default_left[k])
            k = 2 * k + 2 - (1 if left else 0)
        out[i] = k - first
    return out


def leaf_index(X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, is_cat: np.ndarray,
               depth: int, default_left: np.ndarray | None = None) -> np.ndarray:
    """Leaf (0 … 2^d−1) of every row of ``X`` in one tree.

    A missing value (NaN) goes left at node k iff ``default_left[k]`` (None: right everywhere)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    features = np.asarray(features, np.int32)
    if default_left is not None:
        lo, hi = node_bounds(features, thresholds, is_cat)
        return _walk_default(X, features, lo, hi, np.asarray(default_left, np.bool_), int(depth))
    if X.nbytes > STREAMING_BYTES:
        return _leaf_index(X, features, np.asarray(thresholds, np.float64), np.asarray(is_cat, np.bool_),
                           int(depth))
    lo, hi = node_bounds(features, thresholds, is_cat)
    return _walk_blocked(X, features, lo, hi, int(depth))


@njit(cache=True, nogil=True)
def _bin_codes(X, E, counts, is_cat, out):
    n, m = X.shape
    factor = np.zeros(m)  # interpolation slope of each feature's grid (a guess only)
    for f in range(m):
        K = counts[f]
        if K > 2 and E[f, K - 1] > E[f, 0]:
            factor[f] = (K - 1) / (E[f, K - 1] - E[f, 0])
    for i in range(n):
        for f in range(m):
            x = X[i, f]
            K = counts[f]
            if is_cat[f]:
                ok = x >= 0 and x < NO_LEVEL and x == np.floor(x)
                out[i, f] = np.uint8(x) if ok else NO_LEVEL
            elif K <= 0:
                out[i, f] = 0
            elif x != x:  # NaN: right of every threshold, as in the float walk
                out[i, f] = K
            elif x < E[f, 0]:
                out[i, f] = 0
            elif x >= E[f, K - 1]:
                out[i, f] = K
            else:
                # code = #{j : E[f, j] <= x}, here in 1 … K−1: interpolated guess, then exact compares
                g = min(max(int((x - E[f, 0]) * factor[f]) + 1, 1), K - 1)
                while g < K and E[f, g] <= x:
                    g += 1
                while g > 0 and E[f, g - 1] > x:
                    g -= 1
                out[i, f] = g
    return out


def bin_codes(X: np.ndarray, edges: list, is_cat: np.ndarray, column_major: bool = False) -> np.ndarray:
    """``(n, m)`` uint8 codes of the records ``X`` for :func:`leaf_index_codes` (C or F memory order).

    Numeric feature f with sorted public candidate thresholds ``edges[f]``
    (at most 255): ``code = #{j : edges[f][j] ≤ x}`` (NaN → ``len(edges[f])``).
    Categorical feature: the level index if x is one of 0 … 254, else
    :data:`NO_LEVEL`.  Features with ``edges[f] is None`` (numeric) get code 0
    and cannot be used by the code path.  Row-major codes suit trees with a
    random feature per node (one cache line per record); column-major ones
    suit trees testing one feature (cyclical: one byte per record per tree).
    """
    X = np.asarray(X, dtype=np.float64)
    E, counts = pack_edges(edges)
    out = np.empty(X.shape, dtype=np.uint8, order="F" if column_major else "C")
    return _bin_codes(X, E, counts, np.asarray(is_cat, np.bool_), out)


def pack_edges(edges: list) -> tuple[np.ndarray, np.ndarray]:
    """``edges`` (per feature: sorted candidate thresholds or None) as a padded ``(m, 255)`` matrix and counts.

    Counts are −1 for features without edges.  This is the form
    :func:`code_bounds` takes; build it once per dataset.
    """
    m = len(edges)
    E = np.full((m, 255), np.nan)
    counts = np.full(m, -1, dtype=np.int64)
    for f, e in enumerate(edges):
        if e is None:
            continue
        e = np.asarray(e, np.float64)
        if e.size > 255 or np.any(np.diff(e) < 0):
            raise ValueError("edges must be sorted and hold at most 255 values")
        E[f, :e.size] = e
        counts[f] = e.size
    return E, counts


@njit(cache=True, nogil=True)
def _code_bounds(features, thresholds, is_cat, E, counts):
    n_inner = features.shape[0]
    lo = np.zeros(n_inner, dtype=np.int64)
    hi = np.zeros(n_inner, dtype=np.int64)
    for k in range(n_inner):
        f = features[k]
        t = thresholds[k]
        if is_cat[f]:
            if not (t >= 0 and t < NO_LEVEL and t == np.floor(t)):
                return False, lo, hi
            lo[k] = np.int64(t)
            hi[k] = np.int64(t) + 1
        else:
            c = counts[f]
            a, b = 0, c  # first index with E[f, j] >= t (binary search)
            while a < b:
                mid = (a + b) // 2
                if E[f, mid] < t:
                    a = mid + 1
                else:
                    b = mid
            if c < 0 or a >= c or E[f, a] != t:
                return False, lo, hi
            hi[k] = a + 1
    return True, lo, hi


def code_bounds(features: np.ndarray, thresholds: np.ndarray, is_cat: np.ndarray,
                packed: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """Integer ``(lo, hi)`` per node for :func:`leaf_index_codes`, or None if a threshold is not codable.

    ``packed`` is :func:`pack_edges` of the edges the codes were built with.
    A numeric threshold must equal one of its feature's edges exactly
    (``t = edges[j]`` gives ``x < t ⟺ code < j + 1``); a categorical one must
    be a level index 0 … 254 (``x == l ⟺ l ≤ code < l + 1``).
    """
    ok, lo, hi = _code_bounds(np.asarray(features, np.int64), np.asarray(thresholds, np.float64),
                              np.asarray(is_cat, np.bool_), packed[0], packed[1])
    return (lo, hi) if ok else None


def leaf_index_codes(codes: np.ndarray, features: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     depth: int) -> np.ndarray:
    """Leaf of every record from its :func:`bin_codes` (``codes`` is ``(n, m)`` uint8, either order).

    Equal to :func:`leaf_index` on the original matrix when ``(lo, hi)`` come
    from :func:`code_bounds`.  A tree whose inner nodes all test one feature
    is evaluated as a table lookup on that feature's codes.
    """
    features = np.asarray(features, np.int32)
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    if features.size and (features == features[0]).all():
        table = _walk_table(lo, hi, int(depth), 256)
        return _lookup(codes[:, int(features[0])], table)
    return _walk_blocked(codes, features, lo, hi, int(depth))


@njit(cache=True, nogil=True, inline="always")
def _gh_units(pred, y, task, scale, g_units, h_units):
    """Clipped (gradient, Hessian) of one record in integer units (see :func:`grad_hess_units`)."""
    if task == 0:
        g = y - pred
        h = 1.0
    else:
        p = 1.0 / (1.0 + np.exp(-pred))
        g = y - p
        h = p * (1.0 - p)
    # Clamp with selects, not branches: LLVM makes them branch-free (the sign of g is a coin flip).
    gu = np.float64(g_units)
    hu = np.float64(h_units)
    a = np.rint(g * scale)
    a = gu if a > gu else a
    a = -gu if a < -gu else a
    b = np.rint(h * scale)
    b = hu if b > hu else b
    b = 0.0 if b < 0.0 else b
    return np.int64(a), np.int64(b)


@njit(cache=True, nogil=True, parallel=True)
def _grad_hess_units(pred, y, task, scale, g_units, h_units, gq, hq):
    for i in prange(pred.shape[0]):
        gq[i], hq[i] = _gh_units(pred[i], y[i], task, scale, g_units, h_units)


@njit(cache=True, nogil=True)
def _grad_hess_units_one(pred, y, task, scale, g_units, h_units, gq, hq):
    for i in range(pred.shape[0]):
        gq[i], hq[i] = _gh_units(pred[i], y[i], task, scale, g_units, h_units)


def grad_hess_units(pred: np.ndarray, y: np.ndarray, task: int, scale: float, g_units: int,
                    h_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Clipped negative gradients and Hessians in fixed-point units (Alg. 5 lines 2 and 4).

    Regression (squared error, labels in [−1, 1]): g = y − ŷ, h = 1.
    Binary (logistic loss on the margin ŷ): g = y − σ(ŷ), h = σ(ŷ)(1 − σ(ŷ)).
    g is clipped to [−g*, g*] and h to [0, h*], both in integer units.
    """
    pred = np.asarray(pred, np.float64)
    gq, hq = np.empty(pred.shape[0], np.int64), np.empty(pred.shape[0], np.int64)
    kernel = _grad_hess_units if parallel_chunks(pred.shape[0]) > 1 else _grad_hess_units_one  # one chunk: no threads
    kernel(pred, np.asarray(y, np.float64), int(task), float(scale), int(g_units), int(h_units), gq, hq)
    return gq, hq


@njit(cache=True, nogil=True, inline="always")
def _ceil_div(num, den, inv_den):
    """``⌈num/den⌉`` for integers 0 ≤ num < 2^51 and den > 0, exactly, without an integer division.

    The float quotient ``num·inv_den`` is within (num/den)·2^-51 < 1/den of
    num/den, so its truncation is ⌊num/den⌋, or one less when den divides num;
    one exact integer product then gives the ceiling.  (The two integer
    divisions per record were a third of the filter loop's time.)"""
    k = np.int64(np.float64(num) * inv_den)  # ⌊num/den⌋ or, when den divides num, possibly one less
    return k + 1 if k * den < num else k


@njit(cache=True, nogil=True, inline="always")
def _cell_cost(gq, hq, g_units, h_units, inv_g, inv_h, grid, cost_table):
    """Ledger cost of one record: |g|, h rounded up to the grid (see :func:`filter_step`).

    ``inv_g``, ``inv_h`` are ``1.0/g_units``, ``1.0/h_units`` (hoisted out of the loop)."""
    ag = gq if gq >= 0 else -gq
    return cost_table[_ceil_div(hq * grid, h_units, inv_h), _ceil_div(ag * grid, g_units, inv_g)]


@njit(cache=True, nogil=True)
def _filter_step(gq, hq, g_units, h_units, grid, cost_table, spent, budget, available):
    n = gq.shape[0]
    active = np.zeros(n, dtype=np.bool_)
    new_spent = spent.copy()
    inv_g = 1.0 / g_units
    inv_h = 1.0 / h_units
    for i in range(n):
        if not available[i]:
            continue
        c = _cell_cost(gq[i], hq[i], g_units, h_units, inv_g, inv_h, grid, cost_table)
        if spent[i] + c <= budget:
            active[i] = True
            new_spent[i] = spent[i] + c
    return active, new_spent


def filter_step(gq: np.ndarray, hq: np.ndarray, g_units: int, h_units: int, cost_table: np.ndarray,
                spent: np.ndarray, budget: int, available: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Individual Rényi filter for one round (Alg. 1 lines 3–5, Thm. 11).

    |g_i| and h_i are rounded *up* to the grid ``k/K`` of their clip bounds by
    exact integer arithmetic; ``cost_table[kh, kg]`` is the subsampled RDP of
    that grid cell in ledger units.  A record is active iff its spent budget
    plus this round's cost stays within ``budget``; only active records are
    charged.  Returns (active mask, new spent vector).
    """
    grid = cost_table.shape[0] - 1
    return _filter_step(np.asarray(gq, np.int64), np.asarray(hq, np.int64), int(g_units), int(h_units), int(grid),
                        np.ascontiguousarray(cost_table, np.int64), np.asarray(spent, np.int64), np.int64(budget),
                        np.asarray(available, np.bool_))


@njit(cache=True, nogil=True)
def _leaf_sums(leaf, gq, hq, selected, n_leaves):
    out = np.zeros(2 * n_leaves, dtype=np.int64)
    for i in range(leaf.shape[0]):
        if selected[i]:
            out[leaf[i]] += hq[i]
            out[n_leaves + leaf[i]] += gq[i]
    return out


def leaf_sums(leaf: np.ndarray, gq: np.ndarray, hq: np.ndarray, selected: np.ndarray, n_leaves: int) -> np.ndarray:
    """Per-leaf sums of clipped Hessians then gradients, ``[w_0 … w_{L−1}, u_0 … u_{L−1}]`` (int64 units)."""
    return _leaf_sums(np.asarray(leaf, np.int32), np.asarray(gq, np.int64), np.asarray(hq, np.int64),
                      np.asarray(selected, np.bool_), int(n_leaves))


@njit(cache=True, nogil=True, inline="always")
def _round_sums_chunk(t, leaf, pred, y, task, scale, g_units, h_units, sampled, available, all_available, gqs,
                      hqs, part, counts):
    """Chunk t of :func:`round_sums`' records into ``part[t]`` and ``counts[t]``."""
    n = leaf.shape[0]
    n_leaves = part.shape[1] // 2
    step = (n + part.shape[0] - 1) // part.shape[0]
    lo, hi = t * step, min(n, (t + 1) * step)
    given = gqs.shape[0] == n  # the records' gradients, computed before
    n_sampled = 0
    for i in range(lo, hi):
        if sampled[i] and (all_available or available[i]):
            if given:
                gq, hq = gqs[i], hqs[i]
            else:
                gq, hq = _gh_units(pred[i], y[i], task, scale, g_units, h_units)
            part[t, leaf[i]] += hq
            part[t, n_leaves + leaf[i]] += gq
            n_sampled += 1
    n_active = max(hi - lo, 0)
    if not all_available:
        n_active = 0
        for i in range(lo, hi):
            n_active += available[i]
    counts[t, 0] = n_active
    counts[t, 1] = n_sampled


@njit(cache=True, nogil=True, parallel=True)
def _round_sums(leaf, pred, y, task, scale, g_units, h_units, sampled, available, all_available, gqs, hqs, part,
                counts):
    for t in prange(part.shape[0]):  # each chunk into its own sums and counts (exact integers: any order)
        _round_sums_chunk(t, leaf, pred, y, task, scale, g_units, h_units, sampled, available, all_available, gqs,
                          hqs, part, counts)


@njit(cache=True, nogil=True)
def _round_sums_one(leaf, pred, y, task, scale, g_units, h_units, sampled, available, all_available, gqs, hqs,
                    part, counts):
    _round_sums_chunk(0, leaf, pred, y, task, scale, g_units, h_units, sampled, available, all_available, gqs, hqs,
                      part, counts)


@njit(cache=True, nogil=True)
def _round_sums_filtered(leaf, pred, y, task, scale, g_units, h_units, sampled, available, all_available,
                         n_leaves, grid, cost_table, spent, budget):
    out = np.zeros(2 * n_leaves, dtype=np.int64)
    new_spent = spent.copy()
    n_active = 0
    n_sampled = 0
    inv_g = 1.0 / g_units
    inv_h = 1.0 / h_units
    for i in range(leaf.shape[0]):
        if not (all_available or available[i]):
            continue
        gq, hq = _gh_units(pred[i], y[i], task, scale, g_units, h_units)
        c = _cell_cost(gq, hq, g_units, h_units, inv_g, inv_h, grid, cost_table)
        # Branch-free charge: which records are exhausted is unpredictable once budgets run out.
        ok = spent[i] + c <= budget
        new_spent[i] = spent[i] + (c if ok else 0)
        n_active += ok
        if ok and sampled[i]:
            out[leaf[i]] += hq
            out[n_leaves + leaf[i]] += gq
            n_sampled += 1
    return out, new_spent, n_active, n_sampled


def round_sums(leaf: np.ndarray, pred: np.ndarray, y: np.ndarray, task: int, scale: float, g_units: int,
               h_units: int, sampled: np.ndarray, available: np.ndarray | None, n_leaves: int,
               filter_args: tuple | None = None,
               grads: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray | None, int, int]:
    """One round of a site in one pass: gradients, filter, subsample and leaf sums.

    Equals ``gq, hq = grad_hess_units(…)``; ``active, new_spent =
    filter_step(…)`` (with the filter) or ``active = available`` (without);
    ``leaf_sums(leaf, gq, hq, active & sampled, n_leaves)``.  ``available``
    None means every record is available.  ``filter_args`` is ``(cost_table,
    spent, budget)``.  Without the filter only subsampled records have their
    gradients computed, or taken from ``grads`` = ``grad_hess_units(…)`` of
    every record where the caller has them.  Returns ``(sums, new_spent or
    None, #active, #active-and-sampled)``.
    """
    leaf = np.asarray(leaf, np.int32)
    pred = np.asarray(pred, np.float64)
    y = np.asarray(y, np.float64)
    sampled = np.asarray(sampled, np.bool_)
    all_available = available is None
    available = sampled if all_available else np.asarray(available, np.bool_)  # placeholder when all
    if filter_args is None:
        chunks = parallel_chunks(leaf.shape[0])
        part, counts = np.zeros((chunks, 2 * int(n_leaves)), np.int64), np.zeros((chunks, 2), np.int64)
        gqs, hqs = (np.asarray(g, np.int64) for g in grads) if grads is not None else (np.zeros(0, np.int64),) * 2
        kernel = _round_sums if chunks > 1 else _round_sums_one  # one chunk: no threads to wake
        kernel(leaf, pred, y, int(task), float(scale), int(g_units), int(h_units), sampled, available, all_available,
               gqs, hqs, part, counts)
        n_active, n_sampled = counts.sum(axis=0)
        return (part[0] if chunks == 1 else part.sum(axis=0)), None, int(n_active), int(n_sampled)
    cost_table, spent, budget = filter_args
    cost_table = np.ascontiguousarray(cost_table, np.int64)
    sums, new_spent, n_active, n_sampled = _round_sums_filtered(
        leaf, pred, y, int(task), float(scale), int(g_units), int(h_units), sampled, available, all_available,
        int(n_leaves), int(cost_table.shape[0] - 1), cost_table, np.asarray(spent, np.int64), np.int64(budget))
    return sums, new_spent, int(n_active), int(n_sampled)


@njit(cache=True, nogil=True, inline="always")
def _child(codes, i, q, feature, lo, hi, miss, default_left, directed):
    """Record i's node one level down from node q of its level, whose node q tests ``feature[q]``, ``lo[q]``,
    ``hi[q]`` (see :func:`route_level`).  Branch-free: whether a record goes left is a coin flip."""
    f = feature[q]
    c = np.int64(codes[i, f])
    left = (lo[q] <= c) & (c < hi[q])
    if directed:
        left |= miss[i, f] & default_left[q]
    return 2 * q + 1 - np.int64(left)


@njit(cache=True, nogil=True, inline="always")
def _node_bin_sums_chunk(t, index, node, slot, gq, present, bits, count, out, routed, codes, feature, lo, hi, miss,
                         default_left, directed):
    """Chunk t of :func:`node_bin_sums`' records into ``out[t]`` (routed first where ``routed`` is given)."""
    n = index.shape[0]
    width = index.shape[1]
    route = routed.shape[0] == n
    root = node.shape[0] == 0  # no nodes given: every record is in node 0
    step = (n + out.shape[0] - 1) // out.shape[0]
    for i in range(t * step, min(n, (t + 1) * step)):
        q = 0 if root else node[i]
        if route:
            q = _child(codes, i, q, feature, lo, hi, miss, default_left, directed)
            routed[i] = q
        s = slot[q]
        if s < 0 or not present[i]:
            continue
        wi = 1 if count else gq[i]
        if bits > 0:
            wi = (gq[i] << bits) + 1
        for k in range(width):
            out[t, s, index[i, k]] += wi


@njit(cache=True, nogil=True, parallel=True)
def _node_bin_sums(index, node, slot, gq, present, bits, count, out, routed, codes, feature, lo, hi, miss,
                   default_left, directed):
    for t in prange(out.shape[0]):  # each chunk of records into its own histograms (exact integers: any order)
        _node_bin_sums_chunk(t, index, node, slot, gq, present, bits, count, out, routed, codes, feature, lo, hi,
                             miss, default_left, directed)
    return out.sum(axis=0)


@njit(cache=True, nogil=True)
def _node_bin_sums_one(index, node, slot, gq, present, bits, count, out, routed, codes, feature, lo, hi, miss,
                       default_left, directed):
    _node_bin_sums_chunk(0, index, node, slot, gq, present, bits, count, out, routed, codes, feature, lo, hi, miss,
                         default_left, directed)
    return out[0]


def parallel_chunks(n: int) -> int:
    """Chunks of records a parallel kernel sums separately: four per core (uneven chunks even out), at most
    16, each of ≥ 16K records."""
    return max(1, min(16, 4 * (os.cpu_count() or 1), n >> 14))


def _split_args(codes, first, feature, lo, hi, miss=None, default_left=None) -> tuple:
    """The kernels' routing arguments: the level's nodes (from ``first`` on) indexed by their place q in it."""
    directed = miss is not None
    if not directed:
        miss, default_left = np.zeros((1, 1), np.bool_), np.zeros(first + 1, np.bool_)
    return (codes, np.asarray(feature, np.int64)[first:], np.asarray(lo, np.int64)[first:],
            np.asarray(hi, np.int64)[first:], np.asarray(miss, np.bool_), np.asarray(default_left, np.bool_)[first:],
            directed)


def node_bin_sums(index: np.ndarray, node: np.ndarray, slot: np.ndarray, grad_units: np.ndarray,
                  present: np.ndarray, width: int, route: tuple | None = None, bound: int | None = None):
    """Greedy-tree level histograms of some nodes, exact int64: ``out[0, s, j]`` = Σ ``grad_units`` and
    ``out[1, s, j]`` = the count of the present records of the node mapped to slot ``s`` (``slot[node] = s``;
    −1: skip the node; ``node`` empty: every record in node 0) with ``j`` among their bin indices ``index[i]``
    (one per carried feature, each below ``width``: :meth:`fedsbdt.common.modes.greedy.levels.LevelLayout.bin_index`) —
    :func:`fedsbdt.common.modes.greedy.levels.level_sums` of the slotted nodes in one pass over the records.

    With ``route`` = ``(codes, first, feature, lo, hi[, miss, default_left])`` (:func:`route_level`'s
    arguments) the records are first moved one level down in the same pass, and ``(their new nodes, the
    sums by new node)`` is returned.  ``bound``: a bound on ``|grad_units|`` where the caller knows one.

    Where it fits in 63 bits, each record adds the one integer ``g·2^b + 1`` (``2^b`` > the present
    records), so one sum carries both: count = sum mod 2^b, gradient sum = ⌊sum / 2^b⌋ — half the memory
    traffic of two sums; otherwise the two are summed separately."""
    slot = np.asarray(slot, np.int64)
    node = np.asarray(node, np.int64)
    if node.size != index.shape[0] and (node.size or route is not None):  # (routing needs every record's node)
        raise ValueError(f"node_bin_sums: {node.size} nodes for {index.shape[0]} records")
    present = np.asarray(present, np.bool_)
    gq = np.asarray(grad_units, np.int64)
    shape = (parallel_chunks(index.shape[0]), int(max(slot.max(initial=-1) + 1, 0)), int(width))
    n = int(np.count_nonzero(present))
    bits = n.bit_length()
    big = int(bound) if bound is not None else max(int(gq.max()), -int(gq.min())) if gq.size else 0
    routed = np.empty(node.size if route is not None else 0, np.int64)
    split = _split_args(*route) if route is not None else _split_args(np.zeros((1, 1), np.uint8), 0, [0], [0], [0])

    kernel = _node_bin_sums if shape[0] > 1 else _node_bin_sums_one  # one chunk: no threads to wake

    def run(b, count):
        return kernel(index, node, slot, gq, present, b, count, np.zeros(shape, np.int64), routed, *split)

    if (n * big + n) << bits < 2**63:
        packed = run(bits, False)
        sums = np.stack([packed >> bits, packed & ((1 << bits) - 1)])
    else:
        sums = np.stack([run(0, False), run(0, True)])
    return sums if route is None else (routed, sums)


@njit(cache=True, nogil=True, inline="always")
def _gain(GL, NL, G, N, l2):
    """:func:`fedsbdt.common.builders.gains` of one candidate, the same float operations in the same order."""
    GR, NR = G - GL, N - NL
    left = GL * GL / (NL + l2) if NL + l2 > 0 else 0.0
    right = GR * GR / (NR + l2) if NR + l2 > 0 else 0.0
    return left + right


@njit(cache=True, nogil=True)
def _level_gains(sums, a, b, t0, t1, scale, l2, gm, nm, directed):
    n_nodes, width = sums.shape[1], sums.shape[2]
    C = a.shape[0]
    out = np.empty((n_nodes, 2 * C if directed else C))
    pg = np.zeros(width + 1, np.int64)
    pn = np.zeros(width + 1, np.int64)
    for q in range(n_nodes):
        for j in range(width):  # prefix sums: a range of bins is a difference of two
            pg[j + 1] = pg[j] + sums[0, q, j]
            pn[j + 1] = pn[j] + sums[1, q, j]
        G = (pg[t1] - pg[t0]) / scale
        N = np.float64(pn[t1] - pn[t0])
        for c in range(C):
            GL = (pg[b[c]] - pg[a[c]]) / scale
            NL = np.float64(pn[b[c]] - pn[a[c]])
            out[q, c] = _gain(GL, NL, G, N, l2)
            if directed:
                out[q, C + c] = _gain(GL + gm[c, q], NL + nm[c, q], G, N, l2)
    return out


def level_gains(sums: np.ndarray, a: np.ndarray, b: np.ndarray, total: tuple[int, int], scale: float, l2: float,
                missing: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Eq. 2 of every candidate at every node of a level, ``(n_nodes, C)``, from exact integer level histograms
    ``sums`` (``(2, n_nodes, width)``: gradient units, counts): candidate c's left side holds bins
    ``a[c] ≤ j < b[c]`` of its node, the node's records are its bins ``total[0] ≤ j < total[1]``; gradients
    are divided by ``scale``.  With ``missing = (G_M, N_M)``, each ``(C, n_nodes)``, a second block of C
    columns scores the candidates with the node's missing records on the left as well
    (:func:`fedsbdt.common.builders.pair_gains`).  Equal bit for bit to
    :func:`fedsbdt.common.builders.gains` of the same sums."""
    directed = missing is not None
    gm, nm = (np.asarray(m, np.float64) for m in missing) if directed else (np.zeros((1, 1)), np.zeros((1, 1)))
    return _level_gains(np.asarray(sums, np.int64), np.asarray(a, np.int64), np.asarray(b, np.int64),
                        int(total[0]), int(total[1]), float(scale), float(l2), gm, nm, directed)


@njit(cache=True, nogil=True, parallel=True)
def _route_level(codes, node, feature, lo, hi, miss, default_left, directed):
    out = np.empty(node.shape[0], np.int64)
    for i in prange(node.shape[0]):
        out[i] = _child(codes, i, node[i], feature, lo, hi, miss, default_left, directed)
    return out


def route_level(codes: np.ndarray, node: np.ndarray, first: int, feature: np.ndarray, lo: np.ndarray,
                hi: np.ndarray, miss: np.ndarray | None = None, default_left: np.ndarray | None = None) -> np.ndarray:
    """Each record's node one level down (heap order within the level: node q's children are 2q, 2q+1):
    inner node ``first + q`` tests ``lo ≤ code(feature) < hi`` (left); with ``miss`` (bool ``(n, m)``: the
    value is missing) a missing value goes left iff ``default_left`` of the node."""
    codes, *split = _split_args(codes, first, feature, lo, hi, miss, default_left)
    return _route_level(codes, np.asarray(node, np.int64), *split)


@njit(cache=True, nogil=True)
def _leaf_values(sums, n_leaves, h_scale, g_scale, l2, beta):
    out = np.empty(n_leaves, dtype=np.float64)
    for k in range(n_leaves):
        w = np.float64(sums[k]) / h_scale
        u = np.float64(sums[n_leaves + k]) / g_scale
        den = w + l2
        v = u / den if (w >= 0 and den > 0) else 0.0
        out[k] = min(max(v, -beta), beta)
    return out



def leaf_values(noisy_sums: np.ndarray, n_leaves: int, h_scale: float, g_scale: float, l2: float,
                beta: float) -> np.ndarray:
    """``clamp(u/(w + λ), −β, β)`` per leaf from ``[w_0 … w_{L−1}, u_0 … u_{L−1}]`` in units; 0 if w < 0.

    ``w = sum/h_scale`` and ``u = sum/g_scale`` (the fixed-point scales).  In numpy, not numba (the same IEEE
    operations, so the same values bit for bit, ``benchmarks/check_kernels.py``): the coordinator calls only
    this kernel, and loading numba would cost it about 100 MB of memory.
    """
    s = np.ascontiguousarray(noisy_sums, np.int64)
    L = int(n_leaves)
    w = s[:L].astype(np.float64) / float(h_scale)
    u = s[L:2 * L].astype(np.float64) / float(g_scale)
    den = w + float(l2)
    v = np.divide(u, den, out=np.zeros(L), where=(w >= 0) & (den > 0))
    return np.minimum(np.maximum(v, -float(beta)), float(beta))


@njit(cache=True, nogil=True)
def _apply_leaves(pred, leaf, values, eta):
    out = np.empty_like(pred)
    for i in range(pred.shape[0]):
        out[i] = pred[i] + eta * values[leaf[i]]
    return out


def apply_leaves(pred: np.ndarray, leaf: np.ndarray, values: np.ndarray, eta: float) -> np.ndarray:
    """``ŷ + η·v[leaf]`` for every record."""
    return _apply_leaves(np.asarray(pred, np.float64), np.asarray(leaf, np.int32), np.asarray(values, np.float64),
                         float(eta))


@njit(cache=True, nogil=True)
def _predict_margin(X, features, thresholds, leaves, is_cat, depth, eta, init):
    n = X.shape[0]
    T = features.shape[0]
    first_leaf = (1 << depth) - 1
    out = np.full(n, init)
    for i in range(n):
        acc = 0.0
        for t in range(T):
            k = 0
            for _ in range(depth):
                f = features[t, k]
                x = X[i, f]
                if is_cat[f]:
                    right = x != thresholds[t, k]
                else:
                    right = not (x < thresholds[t, k])
                k = 2 * k + 1 + (1 if right else 0)
            acc += leaves[t, k - first_leaf]
        out[i] += eta * acc
    return out


def predict_margin(X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, leaves: np.ndarray,
                   is_cat: np.ndarray, depth: int, eta: float, init: float,
                   default_left: np.ndarray | None = None) -> np.ndarray:
    """Ensemble margin ``init + η·Σ_t v_t(x)`` for every row (trees stacked as T × nodes arrays).

    ``default_left`` (T × nodes bool, optional): where a missing value (NaN) goes; None: right everywhere."""
    if features.shape[0] == 0:
        return np.full(X.shape[0], float(init))
    if default_left is not None:  # tree by tree, summed in the same order as the kernel below
        X = np.ascontiguousarray(X, dtype=np.float64)
        acc = np.zeros(X.shape[0])
        for t in range(features.shape[0]):
            acc += np.asarray(leaves[t], np.float64)[leaf_index(X, features[t], thresholds[t], is_cat, depth,
                                                                default_left=default_left[t])]
        return float(init) + float(eta) * acc
    return _predict_margin(np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(features, np.int32),
                           np.ascontiguousarray(thresholds, np.float64), np.ascontiguousarray(leaves, np.float64),
                           np.asarray(is_cat, np.bool_), int(depth), float(eta), float(init))
