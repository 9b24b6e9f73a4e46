"""A site's leaf-noise shares: :class:`~fedsbdt.common.noise_shares.NoiseShares` (drawn ahead in a background
thread, each vector handed out once; shared with the coordinator's central noise, hence in ``common/``) and,
for the isolated sampler, the blocks drawn in child processes (:func:`isolated_shares`).
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.noise_shares import NoiseShares

__all__ = ["ISOLATED_BLOCK_BYTES", "SPARE_SHARES", "NoiseShares", "isolated_shares"]


#: bytes of leaf-noise shares a site draws per child process (isolated sampler): 1 MiB is 1024 rounds at depth 6
ISOLATED_BLOCK_BYTES = 1 << 20
#: vectors drawn ahead for each noise divisor other than the expected one (isolated sampler)
SPARE_SHARES = 4


def isolated_shares(randomness, scales: dict, expect, rounds: int, init_scales=None):
    """:class:`NoiseShares` for the isolated sampler, and the initial-score noise share drawn ahead (or None).

    ``randomness`` is a :class:`fedsbdt.client.isolated_noise.IsolatedSampler`: shares are drawn in blocks of up
    to :data:`ISOLATED_BLOCK_BYTES` (at most ``rounds`` + 8 vectors; one child process per block), the
    next block when an eighth of one is left (8 vectors if one block covers all ``rounds``: only retries
    need more), and the first block in the same child as the initial-score share (so a session starts
    with one child, not two).  That child also draws :data:`SPARE_SHARES` vectors for every other
    divisor, so a round with fewer participants takes its share at once while the next block for its
    divisor is drawn in the background (a child takes seconds to start on a loaded machine).
    """
    row = np.asarray(scales[expect], dtype=np.float64)
    chunk = max(8, min(ISOLATED_BLOCK_BYTES // (8 * max(row.size, 1)), rounds + 8))
    keys = [expect] + [k for k in scales if k != expect]
    requests = [("gaussian", np.tile(np.asarray(scales[k], dtype=np.float64), chunk if k == expect else SPARE_SHARES))
                for k in keys]
    if init_scales is not None:
        requests.append(("laplace", np.asarray(init_scales, dtype=np.float64)))
    drawn = randomness.draw(requests)
    low = 8 if chunk >= rounds + 8 else chunk // 8  # a block that covers the session is refilled only for retries
    shares = NoiseShares(randomness, scales, chunk=chunk, ahead=1, expect=expect, low=low,
                         initial=dict(zip(keys, drawn)))
    return shares, (drawn[len(keys)] if init_scales is not None else None)
