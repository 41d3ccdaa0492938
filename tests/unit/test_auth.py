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


# ---- the handshake (csrc/auth/handshake.h) ----------------------------------------

SECRET = b"s" * 32


def run(connector, acceptor, tamper=None):
    """Drives both ends to the end; `tamper(step, bytes)` may change what travels."""
    tamper = tamper or (lambda step, data: data)
    hello = tamper(0, connector.start())
    proof, used = acceptor.consume(hello)
    assert used == len(hello)
    if acceptor.state() == "failed":
        return
    finish, _ = connector.consume(tamper(1, proof))
    if connector.state() == "failed":
        return
    reply, _ = acceptor.consume(tamper(2, finish))
    assert reply == b""


def pair(secret_c=SECRET, secret_a=SECRET, rank_c=1, rank_a=0, expect=0, world=3):
    hooks_ = hooks()
    return (hooks_.Handshake(True, secret_c, rank_c, expect, world),
            hooks_.Handshake(False, secret_a, rank_a, -1, world))


def test_both_ends_learn_each_others_rank():
    c, a = pair()
    run(c, a)
    assert (c.state(), a.state()) == ("done", "done")
    assert (c.peer_rank(), a.peer_rank()) == (0, 1)


def test_a_connector_without_the_secret_learns_nothing_and_is_refused():
    c, a = pair(secret_c=b"x" * 32)
    run(c, a)
    assert c.state() == "failed" and "secret" in c.error()
    assert a.state() == "waiting"  # it never got a valid proof: no frame is read


def test_an_acceptor_without_the_secret_is_refused():
    c, a = pair(secret_a=b"x" * 32)
    run(c, a)
    assert c.state() == "failed" and "prove" in c.error()


def test_a_forged_proof_is_refused():
    c, a = pair()
    flip = lambda step, data: data[:-1] + bytes([data[-1] ^ 1]) if step == 2 else data  # noqa: E731
    run(c, a, flip)
    assert c.state() == "done" and a.state() == "failed" and "secret" in a.error()


def test_a_replayed_proof_does_not_open_another_connection():
    c, a = pair()
    recorded = {}
    run(c, a, lambda step, data: recorded.setdefault(step, data))
    c2, a2 = pair()
    c2.start()  # a new nonce on each end
    a2.consume(recorded[0])
    a2.consume(recorded[2])
    assert a2.state() == "failed"


def test_bytes_that_are_not_a_handshake_are_refused_at_once():
    _, a = pair()
    frame = hooks().encode_frame(12, 1, b"\x80\x04" + b"N0" * 40 + b"N.", [])  # a PYTHON_CALL frame
    assert len(frame) > 44
    reply, _ = a.consume(frame)
    assert reply == b"" and a.state() == "failed" and "magic" in a.error()


def test_ranks_that_are_not_workers_are_refused():
    for rank in (-1, 0, 3, 1 << 30):  # 0 is the acceptor itself
        c, a = pair(rank_c=rank)
        run(c, a)
        assert a.state() == "failed" and "not a worker" in a.error(), rank


def test_the_connector_checks_who_answered():
    c, a = pair(expect=2)  # dialled rank 2, rank 0 answers
    run(c, a)
    assert c.state() == "failed" and "dialled rank 2" in c.error()


def test_only_the_handshakes_bytes_are_consumed():
    c, a = pair()
    hello = c.start()
    reply, used = a.consume(hello + b"frame bytes that follow")
    assert used == len(hello) and len(reply) == 76
