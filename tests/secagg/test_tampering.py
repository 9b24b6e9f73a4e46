"""Tampered messages: wrong sizes, duplicate or missing keys, bad signatures, flipped AEAD bits,
re-addressed shares, bad revealed shares, inconsistent dealers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsbdt.common.secagg import InvalidMessage, MemoryStorage, ProtocolAbort
from fedsbdt.common.secagg import messages as M
from fedsbdt.common.secagg import primitives as P
from fedsbdt.common.secagg import shamir

from .conftest import identities, make_federation, plain_sum, random_inputs

N, T, E, DIM = 4, 3, 2, 5


def flip(b: bytes, i: int = 0) -> bytes:
    return b[:i] + bytes([b[i] ^ 1]) + b[i + 1 :]


def resign_advert(a: M.AdvertiseKeys, **changes) -> M.AdvertiseKeys:
    a = dataclasses.replace(a, **changes)
    sig = P.ed25519_sign(identities(N)[a.sender], M.AdvertiseKeys.SIGN_DOMAIN, a.signing_bytes())
    return dataclasses.replace(a, signature=sig)


def resign_commitments(c: M.SignedCommitments, **changes) -> M.SignedCommitments:
    c = dataclasses.replace(c, **changes)
    sig = P.ed25519_sign(identities(N)[c.dealer], M.SignedCommitments.SIGN_DOMAIN, c.signing_bytes())
    return dataclasses.replace(c, signature=sig)


class Run:
    """Step-by-step driver so tests can tamper with any single message."""

    def __init__(self, n: int = N, t: int = T, e: int = E, coordinator_storage=None) -> None:
        self.fed = make_federation(n, t, coordinator_storage=coordinator_storage)
        self.coord = self.fed.coordinator
        self.sites = self.fed.sites
        self.ids = self.fed.config.site_ids
        self.setup, self.ann = self.coord.begin_epoch(e)
        self.adverts = {s: self.sites[s].handle_epoch_announce(self.ann) for s in self.ids}

    def roster(self) -> M.EpochRoster:
        for a in self.adverts.values():
            self.setup.receive_advertise(a)
        self.roster_msg = self.setup.close_advertise()
        self.share_keys = {s: self.sites[s].handle_epoch_roster(self.roster_msg) for s in self.roster_msg.senders}
        return self.roster_msg

    def route(self) -> dict[str, M.EpochShares]:
        for sk in self.share_keys.values():
            self.setup.receive_share_keys(sk)
        self.routed = self.setup.close_share_keys()
        return self.routed

    def ready(self) -> None:
        self.roster()
        for s, msg in self.route().items():
            self.sites[s].handle_epoch_shares(msg)

    def round_until_unmask(self, drop_input=()):
        self.rnd, self.start = self.coord.begin_round(DIM)
        rng = np.random.default_rng(7)
        self.xs = random_inputs(self.ids, DIM, rng)
        for s in self.start.participants:
            if s not in drop_input:
                self.rnd.receive(self.sites[s].handle_round_start(self.start, self.xs[s]))
        self.creq = self.rnd.close_inputs()
        for s in self.creq.survivors:
            self.rnd.receive(self.sites[s].handle_consistency_request(self.creq))
        self.ureq = self.rnd.close_consistency()
        self.responses = {s: self.sites[s].handle_unmask_request(self.ureq) for s in self.creq.survivors}
        return self.ureq


# =========================================================================== advertisements

def test_coordinator_refuses_bad_advertisements():
    run = Run()
    a = run.adverts["site-01"]
    with pytest.raises(InvalidMessage, match="invalid signature"):
        run.setup.receive_advertise(dataclasses.replace(a, signature=flip(a.signature)))
    with pytest.raises(InvalidMessage, match="invalid signature"):  # signed by a different identity
        other = resign_advert(dataclasses.replace(a, sender="site-02"))
        run.setup.receive_advertise(dataclasses.replace(a, signature=other.signature))
    with pytest.raises(InvalidMessage, match="expected"):  # missing a mask key
        run.setup.receive_advertise(resign_advert(a, mask_keys=a.mask_keys[:-1]))
    with pytest.raises(InvalidMessage, match="expected"):  # one key too many
        run.setup.receive_advertise(resign_advert(a, mask_keys=a.mask_keys + (b"\x09" * 32,)))
    with pytest.raises(InvalidMessage, match="session digest"):
        run.setup.receive_advertise(resign_advert(a, session_digest=b"\x00" * 32))
    run.setup.receive_advertise(run.adverts["site-00"])
    with pytest.raises(InvalidMessage, match="repeats a public key"):  # copies site-00's encryption key
        run.setup.receive_advertise(resign_advert(a, encryption_key=run.adverts["site-00"].encryption_key))
    with pytest.raises(InvalidMessage, match="repeats a public key"):  # copies one of its mask keys
        run.setup.receive_advertise(resign_advert(a, mask_keys=(run.adverts["site-00"].mask_keys[0], a.mask_keys[1])))
    run.setup.receive_advertise(a)
    run.setup.receive_advertise(a)  # an identical retransmission is harmless
    with pytest.raises(InvalidMessage, match="already advertised"):
        run.setup.receive_advertise(resign_advert(a, mask_keys=(b"\x07" * 32, b"\x08" * 32)))


def test_advertisement_wrong_sizes_and_duplicates_refused_at_decode():
    run = Run()
    raw = run.adverts["site-01"].to_bytes()
    a = run.adverts["site-01"]
    # duplicate mask key inside one advert (bytes surgery, then re-signed so only the duplicate is wrong)
    dup = raw.replace(a.mask_keys[1], a.mask_keys[0])
    with pytest.raises(InvalidMessage, match="duplicate public keys"):
        M.decode_message(dup)
    # a 31-byte key: drop one byte of the encryption key
    i = raw.index(a.encryption_key)
    with pytest.raises(InvalidMessage):
        M.decode_message(raw[:i] + raw[i + 1 :])
    # count says 3 keys but only 2 follow
    cnt = (2).to_bytes(4, "big") + a.mask_keys[0]
    with pytest.raises(InvalidMessage, match="truncated"):
        M.decode_message(raw.replace(cnt, (3).to_bytes(4, "big") + a.mask_keys[0]))


def test_site_refuses_bad_rosters():
    run = Run()
    for a in run.adverts.values():
        run.setup.receive_advertise(a)
    roster = run.setup.close_advertise()
    site = run.sites["site-00"]
    adv = list(roster.adverts)
    bad_sig = dataclasses.replace(adv[1], signature=flip(adv[1].signature, 5))
    with pytest.raises(InvalidMessage, match="invalid signature"):
        site.handle_epoch_roster(dataclasses.replace(roster, adverts=(adv[0], bad_sig, *adv[2:])))
    dup = resign_advert(adv[2], encryption_key=adv[1].encryption_key)
    with pytest.raises(InvalidMessage, match="repeats a public key"):
        site.handle_epoch_roster(dataclasses.replace(roster, adverts=(adv[0], adv[1], dup, adv[3])))
    altered_own = resign_advert(adv[0], mask_keys=(b"\x05" * 32, b"\x06" * 32))
    with pytest.raises(InvalidMessage, match="own advertisement"):
        site.handle_epoch_roster(dataclasses.replace(roster, adverts=(altered_own, *adv[1:])))
    with pytest.raises(InvalidMessage, match="session digest"):
        site.handle_epoch_roster(dataclasses.replace(roster, session_digest=b"\x01" * 32, adverts=()))
    assert site.epoch_stage(0) == "advertised"  # refused messages change nothing
    with pytest.raises(ProtocolAbort, match="omits this site"):
        site.handle_epoch_roster(dataclasses.replace(roster, adverts=tuple(adv[1:])))
    assert site.epoch_stage(0) == "aborted"
    run.fed.restart_site("site-00")  # the abort is durable: the epoch's keys are never used
    assert run.fed.sites["site-00"].epoch_stage(0) == "aborted"
    with pytest.raises(ProtocolAbort, match="was aborted"):
        run.fed.sites["site-00"].handle_epoch_roster(roster)
    with pytest.raises(ProtocolAbort, match="only 2 sites"):
        run.sites["site-01"].handle_epoch_roster(dataclasses.replace(roster, adverts=tuple(adv[:2])))
    # the untouched roster still works at a site that was not aborted
    assert isinstance(run.sites["site-02"].handle_epoch_roster(roster), M.ShareKeys)


# =========================================================================== share keys

def test_coordinator_refuses_bad_share_keys():
    run = Run()
    run.roster()
    sk = run.share_keys["site-01"]
    c = sk.commitments
    with pytest.raises(InvalidMessage, match="invalid signature"):
        run.setup.receive_share_keys(dataclasses.replace(sk, commitments=dataclasses.replace(c, signature=flip(c.signature))))
    with pytest.raises(InvalidMessage, match="one encrypted blob"):  # a recipient's blob is missing
        run.setup.receive_share_keys(dataclasses.replace(sk, encrypted=sk.encrypted[:-1]))
    with pytest.raises(InvalidMessage, match="without duplicates"):  # two blobs for one recipient
        dataclasses.replace(sk, encrypted=(sk.encrypted[0], sk.encrypted[0], *sk.encrypted[1:]))
    with pytest.raises(InvalidMessage, match="without duplicates"):  # the same, at the byte level
        raw = sk.to_bytes()
        one = sk.encrypted[0]
        w = M.Writer()
        one._write(w)
        blob = w.getvalue()
        count = len(sk.encrypted).to_bytes(4, "big")
        i = raw.index(count + blob)
        M.decode_message(raw[:i] + (len(sk.encrypted) + 1).to_bytes(4, "big") + blob + blob + raw[i + 4 + len(blob) :])
    short = dataclasses.replace(sk.encrypted[0], ciphertext=sk.encrypted[0].ciphertext[:-1])
    with pytest.raises(InvalidMessage, match="wrong size"):
        run.setup.receive_share_keys(dataclasses.replace(sk, encrypted=(short, *sk.encrypted[1:])))
    row = sk.rows[0]
    bad_row = dataclasses.replace(row, commitments=flip(row.commitments))
    with pytest.raises(InvalidMessage, match="does not match its signed digest"):
        run.setup.receive_share_keys(dataclasses.replace(sk, rows=(bad_row, *sk.rows[1:])))
    fewer = resign_commitments(c, seed_commitments=c.seed_commitments[:1])
    with pytest.raises(InvalidMessage):
        run.setup.receive_share_keys(dataclasses.replace(sk, commitments=fewer))
    other_roster = resign_commitments(c, epoch_digest=b"\x02" * 32)
    with pytest.raises(InvalidMessage, match="different roster"):
        run.setup.receive_share_keys(dataclasses.replace(sk, commitments=other_roster))
    run.setup.receive_share_keys(sk)  # the genuine message is accepted afterwards


def test_site_detects_flipped_aead_bit_and_recovers_with_genuine_message():
    run = Run()
    run.roster()
    routed = run.route()
    msg = routed["site-02"]
    entries = list(msg.entries)
    blob = entries[0].encrypted
    for pos in (0, len(blob.ciphertext) // 2, len(blob.ciphertext) - 1):  # body and tag
        bad = dataclasses.replace(blob, ciphertext=flip(blob.ciphertext, pos))
        tampered = dataclasses.replace(msg, entries=(dataclasses.replace(entries[0], encrypted=bad), *entries[1:]))
        with pytest.raises(InvalidMessage, match="failed authentication"):
            run.sites["site-02"].handle_epoch_shares(tampered)
    bad_nonce = dataclasses.replace(blob, nonce=flip(blob.nonce))
    with pytest.raises(InvalidMessage, match="failed authentication"):
        run.sites["site-02"].handle_epoch_shares(
            dataclasses.replace(msg, entries=(dataclasses.replace(entries[0], encrypted=bad_nonce), *entries[1:]))
        )
    assert run.sites["site-02"].epoch_stage(0) == "shares-sent"
    run.sites["site-02"].handle_epoch_shares(msg)
    assert run.sites["site-02"].epoch_stage(0) == "ready"


def test_share_readdressed_to_another_site_is_refused():
    run = Run()
    run.roster()
    routed = run.route()
    # site-00's blob for site-02, delivered to site-03 in place of site-00's blob for site-03
    for_02 = next(e for e in routed["site-02"].entries if e.dealer == "site-00").encrypted
    msg = routed["site-03"]
    entries = list(msg.entries)
    i = next(k for k, e in enumerate(entries) if e.dealer == "site-00")
    readdressed = dataclasses.replace(for_02, recipient="site-03")
    entries[i] = dataclasses.replace(entries[i], encrypted=readdressed)
    with pytest.raises(InvalidMessage, match="failed authentication"):
        run.sites["site-03"].handle_epoch_shares(dataclasses.replace(msg, entries=tuple(entries)))
    # without changing the recipient field the message is structurally invalid
    entries[i] = dataclasses.replace(entries[i], encrypted=for_02)
    with pytest.raises(InvalidMessage, match="addressed to"):
        dataclasses.replace(msg, entries=tuple(entries))
    # the whole EpochShares of another site
    with pytest.raises(InvalidMessage, match="addressed to"):
        run.sites["site-03"].handle_epoch_shares(routed["site-02"])


def test_site_refuses_bad_epoch_shares_sets():
    run = Run()
    run.roster()
    routed = run.route()
    msg = routed["site-01"]
    entries = list(msg.entries)
    own = next(k for k, e in enumerate(entries) if e.dealer == "site-01")
    site = run.sites["site-01"]
    c0 = entries[0].commitments
    with pytest.raises(InvalidMessage, match="invalid signature"):
        site.handle_epoch_shares(
            dataclasses.replace(msg, entries=(dataclasses.replace(entries[0], commitments=dataclasses.replace(c0, signature=flip(c0.signature))), *entries[1:]))
        )
    with pytest.raises(ProtocolAbort, match="different roster"):
        forged = resign_commitments(c0, epoch_digest=b"\x03" * 32)
        site.handle_epoch_shares(dataclasses.replace(msg, entries=(dataclasses.replace(entries[0], commitments=forged), *entries[1:])))
    site2 = run.sites["site-02"]
    msg2 = routed["site-02"]
    with pytest.raises(ProtocolAbort, match="did not accept this site"):
        site2.handle_epoch_shares(dataclasses.replace(msg2, entries=tuple(e for e in msg2.entries if e.dealer != "site-02")))
    site3 = run.sites["site-03"]
    msg3 = routed["site-03"]
    with pytest.raises(ProtocolAbort, match="only 2 sites shared"):
        site3.handle_epoch_shares(dataclasses.replace(msg3, entries=tuple(e for e in msg3.entries if e.dealer in ("site-00", "site-03"))))
    del own


def test_holder_detects_dealer_whose_commitments_do_not_match_its_shares():
    run = Run()
    run.roster()
    sk = run.share_keys["site-00"]
    rows = list(sk.rows)
    k = next(i for i, r in enumerate(rows) if r.holder == "site-02")
    rows[k] = dataclasses.replace(rows[k], commitments=flip(rows[k].commitments, 3))
    digests = tuple((r.holder, P.row_digest(r.commitments)) for r in rows)
    lying = dataclasses.replace(sk, rows=tuple(rows), commitments=resign_commitments(sk.commitments, row_digests=digests))
    run.share_keys["site-00"] = lying
    routed = run.route()  # the coordinator cannot tell: the dealer's message is self-consistent
    with pytest.raises(InvalidMessage, match="do not match its signed commitments"):
        run.sites["site-02"].handle_epoch_shares(routed["site-02"])
    run.sites["site-03"].handle_epoch_shares(routed["site-03"])  # other holders are unaffected


# =========================================================================== rounds

def test_coordinator_refuses_bad_round_messages():
    run = Run()
    run.ready()
    rnd, start = run.coord.begin_round(DIM)
    xs = random_inputs(run.ids, DIM, np.random.default_rng(0))
    y = run.sites["site-00"].handle_round_start(start, xs["site-00"])
    with pytest.raises(InvalidMessage, match="length"):
        rnd.receive(dataclasses.replace(y, masked=y.masked[:-1].copy()))
    with pytest.raises(InvalidMessage, match="round"):
        rnd.receive(dataclasses.replace(y, round_id=start.round_id + 1))
    with pytest.raises(InvalidMessage, match="session digest"):
        rnd.receive(dataclasses.replace(y, session_digest=b"\x00" * 32))
    with pytest.raises(InvalidMessage, match="not in the session roster"):
        rnd.receive(dataclasses.replace(y, sender="site-77"))
    rnd.receive(y)
    with pytest.raises(InvalidMessage, match="two different masked inputs"):
        rnd.receive(dataclasses.replace(y, masked=y.masked + np.uint64(1)))
    for s in ("site-01", "site-02", "site-03"):
        rnd.receive(run.sites[s].handle_round_start(start, xs[s]))
    creq = rnd.close_inputs()
    sig = run.sites["site-00"].handle_consistency_request(creq)
    with pytest.raises(InvalidMessage, match="invalid consistency signature"):
        rnd.receive(dataclasses.replace(sig, signature=flip(sig.signature)))
    with pytest.raises(InvalidMessage, match="invalid consistency signature"):  # replayed under another name
        rnd.receive(dataclasses.replace(sig, sender="site-01"))
    for s in run.ids:
        rnd.receive(run.sites[s].handle_consistency_request(creq))
    ureq = rnd.close_consistency()
    resp = run.sites["site-00"].handle_unmask_request(ureq)
    with pytest.raises(InvalidMessage, match="exactly the survivors"):
        rnd.receive(dataclasses.replace(resp, seed_shares=resp.seed_shares[1:]))
    with pytest.raises(InvalidMessage, match="exactly the survivors"):  # a mask-key share for a survivor
        rnd.receive(dataclasses.replace(resp, seed_shares=resp.seed_shares[1:], key_shares=resp.seed_shares[:1]))
    with pytest.raises(InvalidMessage, match="exactly the dropped"):  # a mask-key share nobody asked for
        rnd.receive(dataclasses.replace(resp, key_shares=(("site-77", resp.seed_shares[0][1]),)))
    with pytest.raises(InvalidMessage, match="both shares"):
        dataclasses.replace(resp, key_shares=resp.seed_shares[:1])


@pytest.mark.parametrize("stored", [False, True], ids=["in-memory", "rows-let-go-after-storing"])
def test_tampered_revealed_share_is_detected_blamed_and_survived(stored):
    """With a storage the coordinator lets go of the per-share commitment rows once the epoch is stored
    and reloads them for the blame path."""
    run = Run(n=5, t=3, coordinator_storage=MemoryStorage() if stored else None)
    run.ready()
    assert (run.coord.epoch(0)._rows == {}) == stored
    run.round_until_unmask()
    bad = run.responses["site-00"]  # site-00 has the smallest x: its share is on the fast path
    shares = list(bad.seed_shares)
    shares[2] = (shares[2][0], shamir.encode_share((int.from_bytes(shares[2][1], "big") + 1) % shamir.PRIME))
    run.rnd.receive(dataclasses.replace(bad, seed_shares=tuple(shares)))
    for s, r in run.responses.items():
        if s != "site-00":
            run.rnd.receive(r)
    res = run.rnd.finalize()
    assert res.blamed == ("site-00",)
    assert np.array_equal(res.total, plain_sum(run.xs, res.survivors))


def test_tampered_share_with_too_few_honest_shares_aborts_with_blame():
    run = Run(n=5, t=3)
    run.ready()
    run.round_until_unmask()
    bad = run.responses["site-01"]
    shares = list(bad.seed_shares)
    shares[0] = (shares[0][0], flip(shares[0][1], 32))
    run.rnd.receive(dataclasses.replace(bad, seed_shares=tuple(shares)))
    run.rnd.receive(run.responses["site-02"])
    run.rnd.receive(run.responses["site-03"])
    with pytest.raises(ProtocolAbort) as exc:
        run.rnd.finalize()
    assert exc.value.blame == ("site-01",)
    assert run.rnd.stage.name == "failed"


def test_dealer_with_inconsistent_shares_is_blamed(monkeypatch):
    """A dealer whose shares do not lie on one polynomial (but match its own commitments)."""
    import fedsbdt.common.secagg.site as site_mod

    real = shamir.split_many
    calls = {"n": 0}

    def corrupt(secrets, t, xs, randbytes):
        table = real(secrets, t, xs, randbytes)
        calls["n"] += 1
        if calls["n"] == 1:  # the first dealer: site-00
            table[0][0] = (table[0][0] + 1) % shamir.PRIME  # slot-0 seed share for the first holder
        return table

    monkeypatch.setattr(site_mod.shamir, "split_many", corrupt)
    run = Run(n=5, t=3)
    run.ready()  # every holder's check passes: the commitments describe what was dealt
    monkeypatch.setattr(site_mod.shamir, "split_many", real)
    run.round_until_unmask()
    for r in run.responses.values():
        run.rnd.receive(r)
    with pytest.raises(ProtocolAbort, match="inconsistent with its commitment") as exc:
        run.rnd.finalize()
    assert exc.value.blame == ("site-00",)


def test_site_refuses_unmask_request_with_bad_signature():
    run = Run(n=5, t=3)
    run.ready()
    rnd, start = run.coord.begin_round(DIM)
    xs = random_inputs(run.ids, DIM, np.random.default_rng(1))
    for s in run.ids:
        rnd.receive(run.sites[s].handle_round_start(start, xs[s]))
    creq = rnd.close_inputs()
    for s in run.ids:
        rnd.receive(run.sites[s].handle_consistency_request(creq))
    ureq = rnd.close_consistency()
    sigs = list(ureq.signatures)
    sigs[1] = (sigs[1][0], flip(sigs[1][1]))
    with pytest.raises(InvalidMessage, match="invalid consistency signature"):
        run.sites["site-00"].handle_unmask_request(dataclasses.replace(ureq, signatures=tuple(sigs)))
    sigs = list(ureq.signatures)
    sigs[0] = (sigs[0][0], flip(sigs[0][1]))  # site-00's own signature altered
    with pytest.raises(InvalidMessage, match="own consistency signature"):
        run.sites["site-00"].handle_unmask_request(dataclasses.replace(ureq, signatures=tuple(sigs)))
    assert run.sites["site-00"].round_stage(start.round_id) == "signed"
    resp = run.sites["site-00"].handle_unmask_request(ureq)
    assert isinstance(resp, M.UnmaskResponse)
