"""Shared fixtures and helpers for the secure-aggregation tests."""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.common.secagg import SessionConfig, SiteIdentity
from fedsbdt.common.secagg.loopback import LoopbackFederation


class DeterministicRandom:
    """SHAKE-256 counter-mode byte source.  INSECURE — for reproducible tests only."""

    def __init__(self, seed: bytes) -> None:
        self._seed = seed
        self._counter = 0
        self.calls: list[bytes] = []

    def __call__(self, n: int) -> bytes:
        out = hashlib.shake_256(self._seed + self._counter.to_bytes(8, "big")).digest(n)
        self._counter += 1
        self.calls.append(out)
        return out


def site_ids(n: int) -> tuple[str, ...]:
    return tuple(f"site-{i:02d}" for i in range(n))


@lru_cache(maxsize=None)
def identities(n: int) -> dict[str, Ed25519PrivateKey]:
    """Deterministic Ed25519 identity keys for sites site-00 … site-(n-1)."""
    return {s: Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"identity:" + s.encode()).digest()) for s in site_ids(n)}


def make_config(n: int, t: int | None = None, session_id: bytes = b"test-session", **kw) -> SessionConfig:
    t = n // 2 + 1 if t is None else t
    keys = identities(n)
    roster = tuple(SiteIdentity(s, k.public_key().public_bytes_raw()) for s, k in keys.items())
    return SessionConfig(session_id, t, roster, **kw)


def make_federation(n: int, t: int | None = None, seed: bytes | None = None, **kw) -> LoopbackFederation:
    cfg = make_config(n, t, **kw.pop("config_kw", {}))
    extra = {}
    if seed is not None:
        extra["randbytes"] = DeterministicRandom(seed)
    return LoopbackFederation(cfg, identities(n), **extra, **kw)


def random_inputs(ids, d: int, rng: np.random.Generator, bound: int = 2**40) -> dict[str, np.ndarray]:
    return {s: rng.integers(-bound, bound, d, dtype=np.int64) for s in ids}


def plain_sum(inputs, survivors) -> np.ndarray:
    total = np.zeros_like(next(iter(inputs.values())))
    for s in survivors:
        total = total + inputs[s]
    return total


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
