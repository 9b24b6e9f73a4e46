"""The coordinator's bulk decoding of a fast round's replies (FastMaskedInput.decode_expected, ShareLayout):
for the expected dealer list it gives the very object the generic decoder gives, and for anything else it
declines (None), so the generic decoder's checks and errors apply unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from fedsbdt.common.secagg import InvalidMessage, decode_message
from fedsbdt.common.secagg.messages import FastMaskedInput, MaskedInput, ShareLayout

DIGEST = bytes(range(32))
DEALERS = ("a", "bb", "hosp-c", "z" * 64)


def fast(dealers=DEALERS, sender="bb", shares=None) -> FastMaskedInput:
    shares = shares or [b"\x00" + bytes(range(i, i + 32)) for i in range(len(dealers))]
    return FastMaskedInput(DIGEST, 3, 17, sender, np.arange(5, dtype=np.uint64), tuple(zip(dealers, shares)))


def test_the_expected_shape_decodes_to_the_generic_object():
    lay = ShareLayout(DEALERS)
    for msg in (fast(), fast(sender="z" * 64), fast(shares=[b"\x00" + b"\xff" * 32] * 4)):
        data = msg.to_bytes()
        got = FastMaskedInput.decode_expected(data, lay)
        assert got is not None and got == decode_message(data) == msg
        assert got.seed_shares == msg.seed_shares and got.sender == msg.sender and got.dealers == DEALERS
        want = np.array([list(v) for _, v in msg.seed_shares], np.uint8)  # the shares' bytes, one row per dealer
        assert np.array_equal(got.share_matrix(), want) and np.array_equal(msg.share_matrix(), want)
        fresh = FastMaskedInput.decode_expected(data, lay)  # its share bytes are read without the pairs
        assert np.array_equal(fresh.share_matrix(), want) and "_pairs" not in vars(fresh)
        assert np.array_equal(got.masked, msg.masked) and not got.masked.flags.writeable


def _variants():
    good = fast().to_bytes()
    yield "other dealers", fast(dealers=("a", "bb", "hosp-d", "z" * 64)).to_bytes()
    yield "a dealer missing", fast(dealers=DEALERS[:3]).to_bytes()
    yield "an extra dealer", fast(dealers=("0",) + DEALERS).to_bytes()
    yield "truncated", good[:-1]
    yield "trailing byte", good + b"\x00"
    yield "other message type", MaskedInput(DIGEST, 3, 17, "bb", np.arange(5, dtype=np.uint64)).to_bytes()
    yield "bad magic", b"FSB" + good[3:]
    pos = good.index(b"hosp-c")
    yield "a dealer id byte flipped", good[:pos] + b"H" + good[pos + 1:]
    yield "a length prefix changed", good[:pos - 1] + b"\x07" + good[pos:]
    lead = pos + len("hosp-c")
    yield "share ≥ 2^256", good[:lead] + b"\x01" + good[lead + 1:]
    yield "share = p", good[:lead] + (2**256 + 297).to_bytes(33, "big") + good[lead + 33:]


@pytest.mark.parametrize("what,data", list(_variants()), ids=[w for w, _ in _variants()])
def test_anything_else_is_left_to_the_generic_decoder(what, data):
    assert FastMaskedInput.decode_expected(data, ShareLayout(DEALERS)) is None
    try:
        msg = decode_message(data)
    except InvalidMessage:
        return
    assert not isinstance(msg, FastMaskedInput) or tuple(d for d, _ in msg.seed_shares) != DEALERS


def test_a_share_between_2_256_and_p_is_declined_and_decoded_generically():
    good = fast().to_bytes()
    lead = good.index(b"hosp-c") + len("hosp-c")
    data = good[:lead] + (2**256 + 296).to_bytes(33, "big") + good[lead + 33:]
    assert FastMaskedInput.decode_expected(data, ShareLayout(DEALERS)) is None
    assert decode_message(data).seed_shares[2] == ("hosp-c", (2**256 + 296).to_bytes(33, "big"))


def test_a_layout_needs_valid_sorted_dealers():
    with pytest.raises(InvalidMessage):
        ShareLayout(("b", "a"))
    with pytest.raises(InvalidMessage):
        ShareLayout(("a", "a b"))


def _set_up_epoch(n: int, rounds: int):
    """An in-process federation of ``n`` sites with one ready epoch: (federation, announcement, routed shares)."""
    from .conftest import make_federation

    fed = make_federation(n)
    setup, ann = fed.coordinator.begin_epoch(rounds)
    for s in fed.config.site_ids:
        setup.receive_advertise(fed.sites[s].handle_epoch_announce(ann))
    roster = setup.close_advertise()
    for s in roster.senders:
        setup.receive_share_keys(fed.sites[s].handle_epoch_roster(roster))
    return fed, ann, setup.close_share_keys()


def test_epoch_shares_parts_concatenate_to_the_encoding_and_share_the_commitments():
    """The coordinator keeps each recipient's EpochShares as parts (server/session.py): their concatenation
    is the canonical encoding, and a dealer's commitments are one bytes object in every recipient's parts."""
    _, _, routed = _set_up_epoch(5, 3)
    parts = {s: m.to_parts() for s, m in routed.items()}
    for s, m in routed.items():
        assert b"".join(parts[s]) == m.to_bytes()
        assert decode_message(b"".join(parts[s])) == m
    ids = [{id(p) for p in ps if len(p) > 100} for ps in parts.values()]
    common = set.intersection(*ids)
    assert len(common) == len(routed)  # one shared encoding per dealer, in every recipient's parts
    for s, m in routed.items():  # each blob is the dealer's ShareKeys' ciphertext itself, not a copy
        held = {id(p) for p in parts[s]}
        assert all(id(e.encrypted.ciphertext) in held for e in m.entries if e.encrypted is not None)
