"""Canonical encodings: round trips, size validation, garbage and truncation refused."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsbdt.common.secagg import InvalidMessage, messages as M
from fedsbdt.common.secagg.encoding import Reader, Writer

from .conftest import make_federation, random_inputs


@pytest.fixture(scope="module")
def transcript():
    fed = make_federation(4, 3, seed=b"messages")
    fed.run_epoch(2)
    rng = np.random.default_rng(1)
    fed.run_round(random_inputs(fed.config.site_ids, 5, rng), 5, drop_before_input=["site-01"])
    fed.run_round(random_inputs(fed.config.site_ids, 5, rng), 5, fast=True)
    return [hop.data for hop in fed.transcript]


ALL_TYPES = {
    M.EpochAnnounce, M.AdvertiseKeys, M.EpochRoster, M.ShareKeys, M.EpochShares, M.RoundStart,
    M.MaskedInput, M.ConsistencyRequest, M.ConsistencySignature, M.UnmaskRequest, M.UnmaskResponse,
    M.FastRoundStart, M.FastMaskedInput,
}


def test_every_message_type_round_trips(transcript):
    seen = set()
    for data in transcript:
        msg = M.decode_message(data)
        seen.add(type(msg))
        assert msg.to_bytes() == data  # canonical: re-encoding is byte-identical
        assert type(msg).from_bytes(data) == msg
        assert M.decode_message(msg.to_bytes()) == msg
    assert seen == ALL_TYPES


def test_from_bytes_checks_the_type(transcript):
    data = next(d for d in transcript if isinstance(M.decode_message(d), M.RoundStart))
    with pytest.raises(InvalidMessage, match="expected a MaskedInput"):
        M.MaskedInput.from_bytes(data)
    fast = next(d for d in transcript if type(M.decode_message(d)) is M.FastRoundStart)
    assert M.RoundStart.from_bytes(fast).fast  # a FastRoundStart is a RoundStart marked fast
    with pytest.raises(InvalidMessage, match="expected a FastRoundStart"):
        M.FastRoundStart.from_bytes(data)
    with pytest.raises(InvalidMessage, match="expected a MaskedInput"):
        M.MaskedInput.from_bytes(next(d for d in transcript if isinstance(M.decode_message(d), M.FastMaskedInput)))


def test_every_registered_type_is_in_the_transcript():
    assert set(M._REGISTRY.values()) == ALL_TYPES


def test_fast_round_start_differs_from_round_start_only_in_the_tag(transcript):
    fast = next(M.decode_message(d) for d in transcript if type(M.decode_message(d)) is M.FastRoundStart)
    slow = M.RoundStart(fast.session_digest, fast.epoch, fast.round_id, fast.vector_len, fast.participants)
    a, b = fast.to_bytes(), slow.to_bytes()
    assert a[:4] == b[:4] and a[5:] == b[5:] and (a[4], b[4]) == (M.FastRoundStart.TAG, M.RoundStart.TAG)
    assert fast != slow and not slow.fast and fast.fast


def test_truncation_and_trailing_bytes_refused(transcript):
    for data in transcript:
        step = max(1, len(data) // 40)  # every prefix for small messages, a sample for large ones
        for cut in list(range(0, len(data), step)) + [len(data) - 1]:
            with pytest.raises(InvalidMessage):
                M.decode_message(data[:cut])
        with pytest.raises(InvalidMessage, match="trailing"):
            M.decode_message(data + b"\x00")


def test_header_checks(transcript):
    data = transcript[0]
    with pytest.raises(InvalidMessage, match="magic"):
        M.decode_message(b"XXX" + data[3:])
    with pytest.raises(InvalidMessage, match="version"):
        M.decode_message(data[:3] + b"\x02" + data[4:])
    with pytest.raises(InvalidMessage, match="unknown"):
        M.decode_message(data[:4] + b"\xee" + data[5:])
    with pytest.raises(InvalidMessage):
        M.decode_message("not bytes")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.binary(max_size=400))
def test_random_garbage_only_raises_invalid_message(blob):
    for data in (blob, b"FSA\x01" + blob[:1] + blob[1:]):
        try:
            M.decode_message(data)
        except InvalidMessage:
            pass


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_bit_flips_never_crash(transcript, data):
    raw = bytearray(data.draw(st.sampled_from(transcript)))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        msg = M.decode_message(bytes(raw))
    except InvalidMessage:
        return
    assert msg.to_bytes() == bytes(raw)  # if it decodes, the encoding is still canonical


D = b"\x11" * 32


def test_structural_validation_on_construction():
    with pytest.raises(InvalidMessage, match="exactly 32 bytes"):
        M.EpochAnnounce(b"\x00" * 31, 0, 0, 1)
    with pytest.raises(InvalidMessage, match="rounds per epoch"):
        M.EpochAnnounce(D, 0, 0, 0)
    with pytest.raises(InvalidMessage, match="exactly 32 bytes"):
        M.AdvertiseKeys(D, 0, 0, "a", b"e" * 31, (b"k" * 32,), b"s" * 64)
    with pytest.raises(InvalidMessage, match="duplicate public keys"):
        M.AdvertiseKeys(D, 0, 0, "a", b"e" * 32, (b"k" * 32, b"k" * 32), b"s" * 64)
    with pytest.raises(InvalidMessage, match="duplicate public keys"):
        M.AdvertiseKeys(D, 0, 0, "a", b"k" * 32, (b"k" * 32,), b"s" * 64)
    with pytest.raises(InvalidMessage, match="64 bytes"):
        M.AdvertiseKeys(D, 0, 0, "a", b"e" * 32, (b"k" * 32,), b"s" * 63)
    with pytest.raises(InvalidMessage, match="strictly sorted"):
        M.RoundStart(D, 0, 0, 4, ("b", "a"))
    with pytest.raises(InvalidMessage, match="strictly sorted"):
        M.RoundStart(D, 0, 0, 4, ("a", "a"))
    with pytest.raises(InvalidMessage, match="valid site id"):
        M.RoundStart(D, 0, 0, 4, ("a b",))
    with pytest.raises(InvalidMessage, match="uint64"):
        M.MaskedInput(D, 0, 0, "a", np.zeros(3, dtype=np.int64))
    with pytest.raises(InvalidMessage, match="33 bytes"):
        M.UnmaskResponse(D, 0, 0, "a", (("b", b"\x00" * 32),), ())
    with pytest.raises(InvalidMessage, match="field element"):
        M.UnmaskResponse(D, 0, 0, "a", (("b", b"\xff" * 33),), ())
    with pytest.raises(InvalidMessage, match="both shares"):
        M.UnmaskResponse(D, 0, 0, "a", (("b", b"\x00" * 33),), (("b", b"\x00" * 33),))
    with pytest.raises(InvalidMessage, match="integer"):
        M.RoundStart(D, -1, 0, 4, ("a",))
    with pytest.raises(InvalidMessage, match="integer"):
        M.RoundStart(D, 0, 2**63, 4, ("a",))
    y = np.zeros(3, dtype=np.uint64)
    with pytest.raises(InvalidMessage, match="uint64"):
        M.FastMaskedInput(D, 0, 0, "a", np.zeros(3, dtype=np.int64), ())
    with pytest.raises(InvalidMessage, match="33 bytes"):
        M.FastMaskedInput(D, 0, 0, "a", y, (("b", b"\x00" * 32),))
    with pytest.raises(InvalidMessage, match="field element"):
        M.FastMaskedInput(D, 0, 0, "a", y, (("b", b"\xff" * 33),))
    with pytest.raises(InvalidMessage, match="strictly sorted"):
        M.FastMaskedInput(D, 0, 0, "a", y, (("b", b"\x00" * 33), ("a", b"\x00" * 33)))
    with pytest.raises(InvalidMessage, match="strictly sorted"):
        M.FastRoundStart(D, 0, 0, 4, ("b", "a"))


def test_masked_input_is_immutable_and_equal_by_encoding():
    v = np.arange(4, dtype=np.uint64)
    m = M.MaskedInput(D, 0, 1, "a", v)
    v[0] = 99  # the message holds its own copy
    assert int(m.masked[0]) == 0
    with pytest.raises(ValueError):
        m.masked[0] = 5
    assert m == M.MaskedInput(D, 0, 1, "a", np.arange(4, dtype=np.uint64))
    assert m != M.MaskedInput(D, 0, 1, "a", np.arange(1, 5, dtype=np.uint64))
    assert len({m, M.MaskedInput.from_bytes(m.to_bytes())}) == 1


def test_reader_limits_are_checked_before_allocation():
    huge = Writer().u32(2**31).getvalue()
    with pytest.raises(InvalidMessage, match="exceeds the limit"):
        Reader(huge, "x").var("field", 1000)
    with pytest.raises(InvalidMessage, match="exceeds the limit"):
        Reader(huge, "x").ring("vec", 10)
    with pytest.raises(InvalidMessage, match="truncated"):
        Reader(Writer().u32(10).getvalue(), "x").var("field", 1000)
    bad_utf8 = Writer().var(b"\xff\xfe").getvalue()
    with pytest.raises(InvalidMessage, match="UTF-8"):
        Reader(bad_utf8, "x").text("name")


def _pairs_slow(data: bytes, n: int):
    r = Reader(data, "x")
    return tuple((r.site_id("dealer"), r.raw(33, "share")) for _ in range(n)), r


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "site-1", "b.c", "", "x" * 65, "é", "bad id"]),
                          st.one_of(st.binary(min_size=33, max_size=33), st.binary(max_size=40))), max_size=6),
       st.integers(0, 8), st.integers(0, 3))
def test_id_fields_reads_exactly_what_the_field_by_field_loop_reads(pairs, n, cut):
    """The coordinator's one-pass reader of (dealer, share) pairs returns the same pairs, leaves the reader
    at the same offset, and raises the same error as reading the fields one at a time."""
    w = Writer()
    for sid, share in pairs:
        w.text(sid).raw(share)
    data = w.getvalue()
    data = data[: max(len(data) - cut, 0)]
    try:
        want, slow = _pairs_slow(data, n)
        want_pos = slow._pos
    except InvalidMessage as e:
        with pytest.raises(InvalidMessage) as got:
            Reader(data, "x").id_fields(n, "dealer", 33, "share")
        assert str(got.value) == str(e)
        return
    fast = Reader(data, "x")
    assert fast.id_fields(n, "dealer", 33, "share") == want
    assert fast._pos == want_pos


def test_unmask_response_refuses_a_share_outside_the_field():
    from fedsbdt.common.secagg.shamir import PRIME

    ok = (PRIME - 1).to_bytes(33, "big")
    M.UnmaskResponse(bytes(32), 1, 2, "a", (("a", ok),), ())
    for bad in (PRIME.to_bytes(33, "big"), (PRIME + 5).to_bytes(33, "big"), b"\xff" * 33):
        with pytest.raises(InvalidMessage, match="not a field element"):
            M.UnmaskResponse(bytes(32), 1, 2, "a", (("a", bad),), ())
