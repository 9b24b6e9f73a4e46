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


def draw_share(plan, release, randomness, *, participants: int | None, retry: bool, where=None, ahead=None):
    """The noise share this site adds to one attempt of ``release`` (a ``Release`` of ``plan.releases``), or None.

    The site's one noise rule, for every release kind of every mode (docs/threat-model.md "Retries"):

    * **split** noise (tree, level and sketch rounds), distributed: a share of variance σ²/k_r of the release's
      full noise, k_r = ``plan.noise_divisor(p)`` recomputed from the public plan and the round's ``participants``
      (none for an impossible participant set: secure aggregation refuses that round); central: no share on the
      first attempt (the coordinator adds the noise), a full, fresh share on a ``retry``;
    * **full** noise (the initial score, the evaluation): distributed, a full share; central, a full share on a
      ``retry`` only — or on every attempt for noise the coordinator never adds (``Noise.central`` False: the
      evaluation).

    ``where`` fixes the layout of the noise (``Noise.scales``); ``ahead`` holds shares drawn beforehand:
    :class:`NoiseShares` (split noise, one buffer per divisor) or one vector (full noise), used instead of a new
    draw.  The sampler follows the release's mechanism (discrete Gaussian or discrete Laplace).
    """
    noise, where = release.noise, dict(where or {})
    draw = randomness.discrete_gaussian if noise.mechanism == "gaussian" else randomness.discrete_laplace
    if not noise.split:
        if noise.central and not retry and plan.noise != "distributed":  # the coordinator adds it
            return None
        if ahead is not None and not retry:
            return ahead
        return draw(release.scales(1, **where))
    if plan.noise == "distributed":
        p = int(participants)
        if not plan.threshold <= p <= plan.n:  # secure aggregation refuses the round
            return None
        k = plan.noise_divisor(p)
        return ahead.take(k) if ahead is not None else draw(release.scales(k, **where))
    return draw(release.scales(1, **where)) if retry else None
