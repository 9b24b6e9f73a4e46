"""Canonical, length-prefixed binary encoding used by every message and record.

Rules (so that every value has exactly one encoding, which is what signatures
and digests are computed over):

* integers are fixed width, big-endian (``u8``, ``u32``, ``u64``);
* variable-length byte strings and UTF-8 texts carry a ``u32`` length prefix;
* lists carry a ``u32`` count prefix;
* fixed-size fields (keys, digests, shares) are written raw after their size
  has been checked;
* vectors of ring elements are ``count · 8`` bytes little-endian ``uint64``;
* a decoder must consume the input exactly: trailing bytes are an error.

The :class:`Reader` checks every length against both the remaining input and
an explicit upper bound *before* allocating anything, and raises
:class:`~fedsbdt.common.secagg.errors.InvalidMessage` naming the field that failed.
Nothing here is specific to a message type; that lives in ``messages.py``.
"""
from __future__ import annotations

import re
import struct
from typing import Iterable

import numpy as np

from .errors import InvalidMessage

#: Largest roster the encoding accepts.
MAX_SITES = 1024
#: Largest number of round slots per epoch.
MAX_EPOCH_ROUNDS = 4096
#: Largest vector length (ring elements) per round.
MAX_VECTOR_LEN = 1 << 22
#: Largest round / epoch id (ids are u64 but must stay below 2^63).
MAX_ID = (1 << 63) - 1

_SITE_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
#: Many site ids, each followed by a newline (which no valid id contains): one regex call checks a whole list.
_SITE_IDS_RE = re.compile(r"(?:[A-Za-z0-9._:-]{1,64}\n)*")

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def check_site_id(site_id: object, what: str = "site id") -> str:
    """Return ``site_id`` if it is a valid site id (1–64 chars of ``[A-Za-z0-9._:-]``)."""
    if not isinstance(site_id, str) or not _SITE_ID_RE.fullmatch(site_id):
        raise InvalidMessage(f"{what} {site_id!r} is not a valid site id (1-64 characters of A-Z a-z 0-9 . _ : -)")
    return site_id


def check_sorted_ids(ids: Iterable[str], what: str) -> tuple[str, ...]:
    """Return ``ids`` as a tuple after checking each is valid and the list is strictly increasing."""
    out = tuple(ids)
    if _valid_sorted_ids(out):  # fast path: the checks below would all pass
        return out
    for i in out:
        check_site_id(i, f"{what} entry")
    for a, b in zip(out, out[1:]):
        if not a < b:
            raise InvalidMessage(f"{what} must be strictly sorted without duplicates ({a!r} before {b!r})")
    if len(out) > MAX_SITES:
        raise InvalidMessage(f"{what} lists {len(out)} sites, more than the limit {MAX_SITES}")
    return out


def _valid_sorted_ids(ids: tuple) -> bool:
    """True iff :func:`check_sorted_ids` accepts ``ids``, checked in bulk (one regex call, C-level comparisons).

    A false answer only sends the caller to the item-by-item checks, which name the offending entry.
    """
    if len(ids) > MAX_SITES or not set(map(type, ids)) <= {str}:
        return False
    text = "\n".join(ids) + "\n"
    return (text.count("\n") == len(ids) and _SITE_IDS_RE.fullmatch(text) is not None
            and all(map(str.__lt__, ids, ids[1:])))


def check_bytes(value: object, size: int, what: str) -> bytes:
    """Return ``value`` if it is ``bytes`` of exactly ``size`` bytes."""
    if not isinstance(value, bytes) or len(value) != size:
        got = len(value) if isinstance(value, (bytes, bytearray)) else type(value).__name__
        raise InvalidMessage(f"{what} must be exactly {size} bytes, got {got}")
    return value


def check_int(value: object, lo: int, hi: int, what: str) -> int:
    """Return ``value`` if it is an ``int`` (not bool) in ``[lo, hi]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not (lo <= value <= hi):
        raise InvalidMessage(f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


class Writer:
    """Append-only builder of a canonical encoding."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, v: int) -> "Writer":
        self._parts.append(bytes((v,)))
        return self

    def u32(self, v: int) -> "Writer":
        self._parts.append(_U32.pack(v))
        return self

    def u64(self, v: int) -> "Writer":
        self._parts.append(_U64.pack(v))
        return self

    def raw(self, b: bytes) -> "Writer":
        """Fixed-size field; the caller has already checked its size."""
        self._parts.append(bytes(b))
        return self

    def var(self, b: bytes) -> "Writer":
        """Length-prefixed byte string."""
        self._parts.append(_U32.pack(len(b)))
        self._parts.append(bytes(b))
        return self

    def text(self, s: str) -> "Writer":
        return self.var(s.encode("utf-8"))

    def ids(self, ids: Iterable[str]) -> "Writer":
        ids = list(ids)
        self.u32(len(ids))
        for i in ids:
            self.text(i)
        return self

    def ring(self, v: np.ndarray) -> "Writer":
        """Vector of uint64, count-prefixed, little-endian."""
        v = np.ascontiguousarray(v, dtype="<u8")
        self.u32(v.shape[0])
        self._parts.append(v.tobytes())
        return self

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Strict decoder over a byte string; every error names ``what`` and the offset."""

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidMessage(f"{what}: expected bytes, got {type(data).__name__}")
        self._data = bytes(data)
        self._pos = 0
        self._what = what

    def _fail(self, msg: str) -> InvalidMessage:
        return InvalidMessage(f"{self._what}: {msg} (at byte {self._pos} of {len(self._data)})")

    def _take(self, n: int, field: str) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise self._fail(f"truncated while reading {field} ({n} bytes needed, {len(self._data) - self._pos} left)")
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def u8(self, field: str) -> int:
        return self._take(1, field)[0]

    def u32(self, field: str) -> int:
        return _U32.unpack(self._take(4, field))[0]

    def u64(self, field: str) -> int:
        return _U64.unpack(self._take(8, field))[0]

    def raw(self, n: int, field: str) -> bytes:
        return self._take(n, field)

    def count(self, field: str, maximum: int) -> int:
        n = self.u32(field)
        if n > maximum:
            raise self._fail(f"{field} count {n} exceeds the limit {maximum}")
        return n

    def var(self, field: str, maximum: int) -> bytes:
        n = self.u32(field)
        if n > maximum:
            raise self._fail(f"{field} length {n} exceeds the limit {maximum}")
        return self._take(n, field)

    def text(self, field: str, maximum: int = 256) -> str:
        b = self.var(field, maximum)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(f"{field} is not valid UTF-8") from None

    def site_id(self, field: str) -> str:
        s = self.text(field, 64)
        try:
            return check_site_id(s, field)
        except InvalidMessage as exc:
            raise self._fail(str(exc)) from None

    def id_fields(self, n: int, id_field: str, size: int, field: str) -> tuple[tuple[str, bytes], ...]:
        """``n`` pairs ``(site_id(id_field), raw(size, field))`` — what a loop of those two reads returns.

        The coordinator decodes n·n such pairs per round (every survivor's shares of every survivor), so
        this reads them in one pass and checks each distinct id once; on any irregularity it re-reads the
        pairs one field at a time, which raises exactly the error the plain loop would.  When every id
        has the first one's length (sites named alike), the pairs sit at a fixed stride and are sliced
        and checked in bulk (:meth:`_fixed_stride_id_fields`).
        """
        fast = self._fixed_stride_id_fields(n, size)
        if fast is not None:
            return fast
        data, start, end = self._data, self._pos, len(self._data)
        pos, out, ok = start, [], {}
        unpack = _U32.unpack_from
        for _ in range(n):
            if pos + 4 > end:
                break
            k = unpack(data, pos)[0]
            if k > 64 or pos + 4 + k + size > end:
                break
            raw_id = data[pos + 4 : pos + 4 + k]
            sid = ok.get(raw_id)
            if sid is None:
                try:
                    sid = check_site_id(raw_id.decode("utf-8"))
                except (UnicodeDecodeError, InvalidMessage):
                    break
                ok[raw_id] = sid
            pos += 4 + k
            out.append((sid, data[pos : pos + size]))
            pos += size
        else:
            self._pos = pos
            return tuple(out)
        self._pos = start
        return tuple((self.site_id(id_field), self.raw(size, field)) for _ in range(n))

    def _fixed_stride_id_fields(self, n: int, size: int) -> tuple[tuple[str, bytes], ...] | None:
        """:meth:`id_fields` for ``n`` pairs whose ids all have the first id's length, or None.

        Then pair i starts at ``i · (4 + k + size)``: the length prefixes are compared as strided byte
        slices, the ids validated with one regex call over their newline-joined text (a newline inside an
        id changes the count and fails).  None (nothing consumed) whenever anything differs, so the caller
        reads the pairs one at a time.
        """
        data, start = self._data, self._pos
        if n < 1 or start + 4 > len(data):
            return None
        k = _U32.unpack_from(data, start)[0]
        stride = 4 + k + size
        stop = start + n * stride
        if not 1 <= k <= 64 or stop > len(data):
            return None
        block = data[start:stop]
        if any(block[i::stride] != block[i:i + 1] * n for i in range(4)):
            return None
        try:
            text = b"\n".join([block[p:p + k] for p in range(4, n * stride, stride)]).decode("utf-8")
        except UnicodeDecodeError:
            return None
        ids = text.split("\n")
        if len(ids) != n or _SITE_IDS_RE.fullmatch(text + "\n") is None:
            return None
        self._pos = stop
        return tuple(zip(ids, [block[p:p + size] for p in range(4 + k, n * stride, stride)]))

    def ids(self, field: str) -> tuple[str, ...]:
        n = self.count(field, MAX_SITES)
        out = tuple(self.site_id(field) for _ in range(n))
        try:
            return check_sorted_ids(out, field)
        except InvalidMessage as exc:
            raise self._fail(str(exc)) from None

    def ring(self, field: str, maximum: int = MAX_VECTOR_LEN) -> np.ndarray:
        n = self.count(field, maximum)
        b = self._take(8 * n, field)
        return np.frombuffer(b, dtype="<u8").astype(np.uint64)

    def done(self) -> None:
        if self._pos != len(self._data):
            raise self._fail(f"{len(self._data) - self._pos} unexpected trailing bytes")
