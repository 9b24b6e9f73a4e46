"""The CSPRNG every random bit of fedsbdt's privacy mechanisms comes from: AES-256-CTR keystream under a fresh
32-byte ``os.urandom`` key per block (a key-erasure DRBG; design.md "Noise").

The lowest module of the noise stack: :mod:`fedsbdt.common.exact_noise` (the exact samplers' words) and
:mod:`fedsbdt.common.randomness` (the Poisson subsample, :class:`~fedsbdt.common.randomness.SecureRandomness`)
both draw from here, and it imports neither.
"""
from __future__ import annotations

import os
import threading

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def csprng_bytes(n: int) -> bytes:
    """``n`` bytes of AES-256-CTR keystream under a fresh ``os.urandom`` key (key erasure: never reused)."""
    enc = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(b"\x00" * 16)).encryptor()
    return enc.update(b"\x00" * n) + enc.finalize()


def csprng_uint64(n: int) -> np.ndarray:
    return np.frombuffer(csprng_bytes(8 * n), dtype="<u8")


_zero_block = b""
_zero_lock = threading.Lock()
_scratch = threading.local()


def _zeros(nbytes: int) -> memoryview:
    """A shared read-only block of ``nbytes`` zero bytes (grown on demand, never written)."""
    global _zero_block
    if len(_zero_block) < nbytes:
        with _zero_lock:
            if len(_zero_block) < nbytes:
                _zero_block = bytes(max(nbytes, 2 * len(_zero_block)))
    return memoryview(_zero_block)[:nbytes]


def _keystream_scratch(nbytes: int, slot: str) -> np.ndarray:
    """``nbytes`` of AES-256-CTR keystream under a fresh ``os.urandom`` key, in the calling thread's
    scratch buffer ``slot`` (uint8; valid until that thread's next call for the same slot)."""
    buf = getattr(_scratch, slot, None)
    if buf is None or buf.size < nbytes + 16:
        buf = np.empty(nbytes + 16, dtype=np.uint8)
        setattr(_scratch, slot, buf)
    enc = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(b"\x00" * 16)).encryptor()
    written = enc.update_into(_zeros(nbytes), buf)
    enc.finalize()
    if written != nbytes:
        raise RuntimeError(f"AES-CTR produced {written} of {nbytes} keystream bytes")
    return buf[:nbytes]


def _csprng_uint64_scratch(n: int) -> np.ndarray:
    """Like :func:`csprng_uint64` (same fresh-key AES-256-CTR keystream), written into a per-thread buffer.

    The result is only valid until the calling thread's next call: for
    consumers that reduce it at once (the subsample mask), it saves two
    allocations and a copy of 8n bytes per call.
    """
    return _keystream_scratch(8 * n, "buf").view("<u8")


def _keystream_into(out: np.ndarray) -> None:
    """Fill the uint64 array ``out`` with AES-256-CTR keystream under a fresh ``os.urandom`` key."""
    view = out.view(np.uint8)
    view[:] = _keystream_scratch(view.size, "fill")


_POOL_WORDS = 1 << 15


def csprng_fill(out: np.ndarray) -> None:
    """Fill the uint64 array ``out`` in place with CSPRNG words (AES-256-CTR, fresh ``os.urandom`` keys).

    Small requests are served from a per-thread pool of 256 KiB of keystream
    (one key per pool): every word is handed out once and never again, and
    a pool inherited across ``fork`` is dropped, so parent and child never
    share words.  Large requests get their own key.
    """
    if out.dtype != np.uint64 or not out.flags.c_contiguous:
        raise ValueError("csprng_fill fills a contiguous uint64 array")
    n = out.size
    if n > _POOL_WORDS // 4:
        _keystream_into(out)
        return
    pool = getattr(_scratch, "pool", None)
    if pool is None or pool[0] != os.getpid() or pool[2] + n > _POOL_WORDS:
        words = np.empty(_POOL_WORDS, dtype=np.uint64)
        _keystream_into(words)
        pool = _scratch.pool = [os.getpid(), words, 0]
    pos = pool[2]
    out[:] = pool[1][pos:pos + n]
    pool[1][pos:pos + n] = 0  # consumed: erased
    pool[2] = pos + n
