"""The bulk (fast-path) structural checks of the decoders agree with the item-by-item checks they shortcut.

``check_sorted_ids``, ``Reader.id_fields`` and ``messages._check_shares`` first try a bulk check (one regex
call over joined ids, strided slices, C-level maps) and fall back to the plain loop, which names the
offending field.  Each test compares the result — the value, or the exact error — with a reference that is
the plain loop written out here, on random and adversarial inputs.
"""
from __future__ import annotations

import random
import re
import struct

import pytest

from fedsbdt.common.secagg import InvalidMessage
from fedsbdt.common.secagg.encoding import MAX_SITES, Reader, check_sorted_ids
from fedsbdt.common.secagg.messages import _check_shares
from fedsbdt.common.secagg.shamir import PRIME, SHARE_SIZE

_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_ALPHABET = "abcXYZ019._:-"
_BAD_CHARS = ["\n", " ", "é", "/", "\x00", "\n\n"]


def _outcome(fn, *args):
    """(True, value) or (False, the InvalidMessage text / other exception type)."""
    try:
        return True, fn(*args)
    except InvalidMessage as exc:
        return False, str(exc)
    except Exception as exc:  # noqa: BLE001 - the reference raises the same non-protocol errors
        return False, type(exc).__name__


# ----------------------------------------------------------------------------- reference implementations

def reference_sorted_ids(ids, what):
    out = tuple(ids)
    for i in out:
        if not isinstance(i, str) or not _ID.fullmatch(i):
            raise InvalidMessage(f"{what} entry {i!r} is not a valid site id (1-64 characters of A-Z a-z 0-9 . _ : -)")
    for a, b in zip(out, out[1:]):
        if not a < b:
            raise InvalidMessage(f"{what} must be strictly sorted without duplicates ({a!r} before {b!r})")
    if len(out) > MAX_SITES:
        raise InvalidMessage(f"{what} lists {len(out)} sites, more than the limit {MAX_SITES}")
    return out


def reference_id_fields(data: bytes, n: int, size: int):
    r = Reader(data, "test")
    out = tuple((r.site_id("dealer"), r.raw(size, "share")) for _ in range(n))
    r.done()
    return out


def reference_check_shares(entries, what):
    entries = tuple((d, s) for d, s in entries)
    reference_sorted_ids([d for d, _ in entries], what)
    for _, s in entries:
        if not isinstance(s, bytes) or len(s) != SHARE_SIZE:
            got = len(s) if isinstance(s, (bytes, bytearray)) else type(s).__name__
            raise InvalidMessage(f"{what} value must be exactly {SHARE_SIZE} bytes, got {got}")
        if int.from_bytes(s, "big") >= PRIME:
            raise InvalidMessage(f"{what} value is not a field element")
    return entries


# ----------------------------------------------------------------------------- random inputs

def _random_id(rng: random.Random, length: int | None = None) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(length or rng.randint(1, 12)))


def _corrupt_id(rng: random.Random, sid: str) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return ""
    if kind == 1:
        return "a" * 65
    pos = rng.randrange(len(sid) + 1)
    return sid[:pos] + rng.choice(_BAD_CHARS) + sid[pos:]


def _random_ids(rng: random.Random) -> list:
    n = rng.choice([0, 1, 2, 3, rng.randint(4, 60)])
    same = rng.random() < 0.5
    ids = sorted({_random_id(rng, 8 if same else None) for _ in range(n)})
    mutation = rng.randrange(7)
    if ids and mutation == 0:
        ids[rng.randrange(len(ids))] = _corrupt_id(rng, ids[0])
    elif len(ids) > 1 and mutation == 1:
        i = rng.randrange(len(ids) - 1)
        ids[i], ids[i + 1] = ids[i + 1], ids[i]
    elif ids and mutation == 2:
        ids.insert(rng.randrange(len(ids)), ids[rng.randrange(len(ids))])  # duplicate
    elif ids and mutation == 3:
        ids[rng.randrange(len(ids))] = rng.choice([7, None, b"site", ("a",)])
    return ids


def test_check_sorted_ids_matches_the_item_by_item_checks():
    rng = random.Random(20261123)
    for _ in range(3000):
        ids = _random_ids(rng)
        assert _outcome(check_sorted_ids, ids, "survivor set") == _outcome(reference_sorted_ids, ids, "survivor set")


@pytest.mark.parametrize("ids", [
    ["a\nb"], ["a\n", "b"], ["a", "b\n"], ["\n"], [""], ["a" * 64], ["a" * 65], ["b", "a"], ["a", "a"],
    ["a", "b\nc", "d"], [f"s{i:05d}" for i in range(MAX_SITES + 1)], [f"s{i:05d}" for i in range(MAX_SITES)],
    ["ab", "a\n\nb"], ["x", "y", "é"],
])
def test_check_sorted_ids_edge_cases(ids):
    assert _outcome(check_sorted_ids, ids, "set") == _outcome(reference_sorted_ids, ids, "set")


def _encode_pairs(pairs, size):
    out = b""
    for sid, val in pairs:
        raw = sid.encode("utf-8") if isinstance(sid, str) else sid
        out += struct.pack(">I", len(raw)) + raw + val
    return out


def test_id_fields_matches_reading_field_by_field():
    rng = random.Random(7)
    for trial in range(3000):
        size = rng.choice([1, 5, SHARE_SIZE])
        ids = [i if isinstance(i, str) else "x" for i in _random_ids(rng)]
        pairs = [(sid, rng.randbytes(size)) for sid in ids]
        data = bytearray(_encode_pairs(pairs, size))
        n = len(pairs)
        mutation = rng.randrange(6)
        if data and mutation == 0:  # flip one byte anywhere (length prefixes included)
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif data and mutation == 1:  # truncate
            del data[rng.randrange(len(data)):]
        elif mutation == 2:  # trailing bytes
            data += rng.randbytes(rng.randint(1, 40))
        elif mutation == 3 and n:  # claim a different count
            n = max(0, n + rng.choice([-1, 1]))
        data = bytes(data)

        def fast(data=data, n=n, size=size):
            r = Reader(data, "test")
            out = r.id_fields(n, "dealer", size, "share")
            r.done()
            return out

        assert _outcome(fast, ) == _outcome(reference_id_fields, data, n, size), (trial, data, n)


def test_id_fields_on_ids_of_equal_length_that_hide_a_newline_or_non_ascii():
    size = 3
    for pairs in ([("ab", b"xyz"), ("c\nd", b"uvw")][::1], [("a\nb", b"xyz"), ("cde", b"uvw")],
                  [("é", b"xyz"), ("ab", b"uvw")], [(b"\xff\xfe", b"xyz"), ("ab", b"uvw")]):
        data = _encode_pairs(pairs, size)

        def fast(data=data):
            r = Reader(data, "test")
            out = r.id_fields(2, "dealer", size, "share")
            r.done()
            return out

        assert _outcome(fast) == _outcome(reference_id_fields, data, 2, size)


def _random_share(rng: random.Random):
    kind = rng.randrange(12)
    if kind == 0:
        return (2**256 + rng.randrange(297)).to_bytes(SHARE_SIZE, "big")  # a field element ≥ 2^256: valid
    if kind == 1:
        return (PRIME + rng.randrange(1000)).to_bytes(SHARE_SIZE, "big")  # not a field element
    if kind == 2:
        return bytes([rng.randint(1, 255)]) + rng.randbytes(SHARE_SIZE - 1)
    if kind == 3:
        return rng.randbytes(rng.choice([0, 32, 34]))
    if kind == 4:
        return bytearray(b"\0" + rng.randbytes(SHARE_SIZE - 1))
    return b"\0" + rng.randbytes(SHARE_SIZE - 1)


def test_check_shares_matches_the_item_by_item_checks():
    rng = random.Random(11)
    for _ in range(3000):
        ids = _random_ids(rng)
        clean = rng.random() < 0.4
        entries = [(d, (b"\0" + rng.randbytes(SHARE_SIZE - 1)) if clean else _random_share(rng)) for d in ids]
        if entries and rng.random() < 0.1:
            i = rng.randrange(len(entries))
            entries[i] = rng.choice([list(entries[i]), (entries[i][0],), (*entries[i], b"")])
        entries = tuple(entries) if rng.random() < 0.5 else list(entries)
        assert _outcome(_check_shares, entries, "seed shares") == _outcome(reference_check_shares, entries, "seed shares")


def test_check_shares_accepts_the_largest_field_elements_and_refuses_p():
    top = (PRIME - 1).to_bytes(SHARE_SIZE, "big")
    assert _check_shares((("a", top), ("b", bytes(SHARE_SIZE))), "s") == (("a", top), ("b", bytes(SHARE_SIZE)))
    with pytest.raises(InvalidMessage, match="not a field element"):
        _check_shares((("a", bytes(SHARE_SIZE)), ("b", PRIME.to_bytes(SHARE_SIZE, "big"))), "s")
