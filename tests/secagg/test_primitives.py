"""Known-answer tests for the primitives the protocol wraps, and the pinned PRG output."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedsbdt.common.secagg import InvalidMessage
from fedsbdt.common.secagg import primitives as P

h = bytes.fromhex


# --------------------------------------------------------------------------- RFC 7748 §6.1 (X25519)
def test_x25519_rfc7748_section_6_1():
    a = h("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    b = h("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    a_pub = h("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    b_pub = h("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    k = h("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
    assert P.x25519_public(a) == a_pub
    assert P.x25519_public(b) == b_pub
    assert P.x25519_agree(a, b_pub) == k
    assert P.x25519_agree(b, a_pub) == k
    assert P.x25519_agree_many(a, [b_pub, b_pub]) == [k, k]


def test_x25519_rejects_low_order_point():
    a = h("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    with pytest.raises(InvalidMessage):
        P.x25519_agree(a, bytes(32))  # the all-zero u-coordinate yields the all-zero secret


# --------------------------------------------------------------------------- RFC 8032 §7.1 (Ed25519) test 1 and 2
@pytest.mark.parametrize(
    "secret,public,message,signature",
    [
        (
            "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            "",
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
        ),
        (
            "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
            "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
            "72",
            "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
        ),
    ],
)
def test_ed25519_rfc8032(secret, public, message, signature):
    sk = Ed25519PrivateKey.from_private_bytes(h(secret))
    assert P.ed25519_public(sk) == h(public)
    assert sk.sign(h(message)) == h(signature)
    pk = sk.public_key()
    # our wrapper signs label(domain) ‖ message, so the raw RFC signature must not verify under a domain
    assert not P.ed25519_verify(pk, b"x", h(message), h(signature))
    sig = P.ed25519_sign(sk, b"x", h(message))
    assert P.ed25519_verify(pk, b"x", h(message), sig)
    assert not P.ed25519_verify(pk, b"y", h(message), sig)
    assert not P.ed25519_verify(pk, b"x", h(message) + b"\0", sig)
    assert not P.ed25519_verify(pk, b"x", h(message), sig[:-1])


# --------------------------------------------------------------------------- RFC 5869 (HKDF-SHA256) test cases 1 and 3
def test_hkdf_rfc5869_case1():
    okm = P.hkdf_sha256(bytes([0x0B] * 22), h("000102030405060708090a0b0c"), h("f0f1f2f3f4f5f6f7f8f9"), 42)
    assert okm == h("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")


def test_hkdf_rfc5869_case3_empty_salt_info():
    okm = P.hkdf_sha256(bytes([0x0B] * 22), b"", b"", 42)
    assert okm == h("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")


# --------------------------------------------------------------------------- NIST SP 800-38A F.5.5 (CTR-AES256)
def test_aes256_ctr_sp800_38a():
    key = h("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
    ctr = h("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    pt = h("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51")
    ct = h("601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5")
    enc = Cipher(algorithms.AES(key), modes.CTR(ctr)).encryptor()
    assert enc.update(pt) + enc.finalize() == ct


def test_aes256_fips197_c3():
    key = h("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    assert enc.update(h("00112233445566778899aabbccddeeff")) == h("8ea2b7ca516745bfeafc49904b496089")


# --------------------------------------------------------------------------- GCM spec test case 14 (AES-256-GCM)
def test_aes256_gcm_known_answer():
    key, iv, pt = bytes(32), bytes(12), bytes(16)
    out = P.aead_encrypt(key, iv, pt, b"")
    assert out == h("cea7403d4d606b6e074ec5d3baf39d18" + "d0d1c8a799996bf0265b98b5d48ab919")
    assert P.aead_decrypt(key, iv, out, b"") == pt
    flipped = bytes([out[0] ^ 1]) + out[1:]
    with pytest.raises(InvalidMessage):
        P.aead_decrypt(key, iv, flipped, b"")
    with pytest.raises(InvalidMessage):
        P.aead_decrypt(key, iv, out, b"other associated data")


# --------------------------------------------------------------------------- PRG
PRG_KEY = bytes(range(32))


def test_prg_is_aes_ctr_keystream_of_counter_blocks():
    """Independent reconstruction: AES-ECB of the counter blocks 0, 1, 2, … read as <u8."""
    d = 10
    blocks = b"".join(i.to_bytes(16, "big") for i in range((8 * d + 15) // 16))
    enc = Cipher(algorithms.AES(PRG_KEY), modes.ECB()).encryptor()
    stream = (enc.update(blocks) + enc.finalize())[: 8 * d]
    expected = np.frombuffer(stream, dtype="<u8")
    out = P.prg_expand(PRG_KEY, d)
    assert out.dtype == np.uint64
    assert np.array_equal(out, expected)


def test_prg_pinned_output():
    out = P.prg_expand(PRG_KEY, 4)
    assert [int(v) for v in out] == PINNED_PRG
    # prefix-consistent and key-sensitive
    assert np.array_equal(P.prg_expand(PRG_KEY, 2), out[:2])
    assert not np.array_equal(P.prg_expand(bytes(32), 4), out)


# AES-256(key = 00 01 … 1f) applied to counter blocks 0 and 1, split into little-endian u64.
PINNED_PRG = [15032814528976949490, 9256919087594533801, 16546147286388202992, 4410926500381718182]


def test_mask_keys_bind_every_context_field():
    d, s = P.KEY_SIZE, bytes(32)
    base = P.pair_mask_key(s, b"D" * d, 1, 2, "a", "b", 8)
    assert base == P.pair_mask_key(s, b"D" * d, 1, 2, "b", "a", 8)  # symmetric in the pair
    variants = [
        P.pair_mask_key(s, b"E" * d, 1, 2, "a", "b", 8),
        P.pair_mask_key(s, b"D" * d, 9, 2, "a", "b", 8),
        P.pair_mask_key(s, b"D" * d, 1, 3, "a", "b", 8),
        P.pair_mask_key(s, b"D" * d, 1, 2, "a", "c", 8),
        P.pair_mask_key(s, b"D" * d, 1, 2, "a", "b", 9),
        P.self_mask_key(s, b"D" * d, 1, 2, "a", 8),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert P.pair_mask_sign("a", "b") == 1 and P.pair_mask_sign("b", "a") == -1
    with pytest.raises(ValueError):
        P.pair_mask_sign("a", "a")


def test_share_key_is_directional_and_bound():
    s, dg, ed = bytes(32), b"D" * 32, b"E" * 32
    k = P.share_encryption_key(s, dg, 1, ed, "a", "b")
    assert k != P.share_encryption_key(s, dg, 1, ed, "b", "a")
    assert k != P.share_encryption_key(s, dg, 1, b"F" * 32, "a", "b")
    assert P.share_associated_data(dg, 1, ed, "a", "b") != P.share_associated_data(dg, 1, ed, "a", "c")


def test_no_insecure_randomness_in_library():
    """The protocol code must never use numpy's or Python's non-cryptographic generators."""
    root = pathlib.Path(P.__file__).parent
    banned = {"RandomState", "default_rng", "random", "seed"}
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                if node.value.attr == "random" and node.attr in banned:
                    pytest.fail(f"{path.name} uses np.random.{node.attr}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "random" not in names, f"{path.name} imports the random module"
