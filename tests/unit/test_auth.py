"""The handshake's primitives (csrc/auth/hmac.h): SHA-256 and HMAC-SHA256
agree with Python's hashlib and hmac on every length around the block
boundaries, and on keys shorter and longer than a block."""

import hashlib
import hmac
import random

from tests.csrc import hooks


def test_sha256_matches_hashlib():
    rng = random.Random(0)
    for size in list(range(0, 130)) + [1000, 4096, 100_003]:
        data = rng.randbytes(size)
        assert hooks().sha256(data) == hashlib.sha256(data).digest(), size


def test_hmac_sha256_matches_hmac():
    rng = random.Random(1)
    for key_size in (0, 1, 16, 32, 63, 64, 65, 100, 200):
        for message_size in (0, 1, 55, 56, 63, 64, 65, 119, 120, 500):
            key, message = rng.randbytes(key_size), rng.randbytes(message_size)
            expected = hmac.new(key, message, hashlib.sha256).digest()
            assert hooks().hmac_sha256(key, message) == expected, (key_size, message_size)


def test_rfc4231_case_2():
    # RFC 4231, test case 2: a key shorter than the block.
    mac = hooks().hmac_sha256(b"Jefe", b"what do ya want for nothing?")
    assert mac.hex() == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
