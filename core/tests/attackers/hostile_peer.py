#!/usr/bin/python3
"""An admitted but hostile orders peer, built from raw verbs with Debian's
python3-pyverbs (rdma-core), not from rocebus.

It knows the orders token (`--token`) and completes the real handshake of
an orders listener (`--dst`:`--port`): its connect request carries its
hello, nonce and first proof (keyed BLAKE3, written here from the
specification, checked against the tag rocebus pins in `auth.rs`), it checks
the listener's proof and writes its own final proof into the listener's
proof slot by RDMA WRITE. Then it writes one good frame (payload
`pyverbs!`, sequence 1) into the listener's ring and, for each `--modes`
entry (one connection each, in turn), garbage:

  badlen       a sealed frame claiming 2000 payload bytes (over max_payload)
  reserved     a sealed frame of a reserved type (0xFF10)
  midpadding   a sealed padding frame that does not end at the ring's end
  pastring     a header whose length runs past the ring's end
  badseal      a good header with a wrong seal
  seqjump      a frame sealed as sequence 1 + 999,000
  zeros        4 KiB of zeros where the next frame goes
  creditbeyond the listener's credit word: a credit far beyond what it sent
  creditjunk   the listener's credit word: a value and a complement that disagree

and keeps the connection open (never returning credit, never reading) until
the listener drops it or standard input closes. It prints `admitted MODE`
once its good frame is written, `attacked MODE` after the garbage,
`closed MODE` when the listener disconnects, `done` after the last mode,
and then one JSON object with, per mode: `admitted`, `attacked`, `closed_by_listener`, `error`.

Run it with Debian's interpreter (/usr/bin/python3): the python3 first on
a machine's PATH may be another build that does not see python3-pyverbs.
With `--self-test` it only checks its BLAKE3 against rocebus's pinned tag.
"""

import argparse
import json
import os
import select
import signal
import struct
import sys
import time

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1

# ---------------------------------------------------------------- BLAKE3
# The reference design (https://github.com/BLAKE3-team/BLAKE3-specs), for
# inputs of one chunk (1024 bytes): every input hashed here is far shorter.
IV = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
      0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
CHUNK_START, CHUNK_END, ROOT = 1, 2, 8
KEYED_HASH, DERIVE_KEY_CONTEXT, DERIVE_KEY_MATERIAL = 16, 32, 64


def _rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & M32


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & M32
    s[d] = _rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + y) & M32
    s[d] = _rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotr(s[b] ^ s[c], 7)


def _compress(cv, block, counter, block_len, flags):
    m = list(struct.unpack("<16I", block))
    s = list(cv) + IV[:4] + [counter & M32, (counter >> 32) & M32, block_len, flags]
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in PERM]
    for i in range(8):
        s[i] ^= s[i + 8]
        s[i + 8] ^= cv[i]
    return s


def _hash(data, key_words, mode_flags):
    assert len(data) <= 1024, "one chunk only"
    blocks = [data[i:i + 64] for i in range(0, len(data), 64)] or [b""]
    cv = list(key_words)
    for i, b in enumerate(blocks):
        flags = mode_flags
        if i == 0:
            flags |= CHUNK_START
        if i == len(blocks) - 1:
            flags |= CHUNK_END | ROOT
        out = _compress(cv, b.ljust(64, b"\0"), 0, len(b), flags)
        cv = out[:8]
    return struct.pack("<8I", *cv)


def keyed_hash(key, data):
    return _hash(data, struct.unpack("<8I", key), KEYED_HASH)


def derive_key(context, material):
    ck = _hash(context.encode(), IV, DERIVE_KEY_CONTEXT)
    return _hash(material, struct.unpack("<8I", ck), DERIVE_KEY_MATERIAL)


# ------------------------------------------------ rocebus::auth, ring::frame
ORDERS_CONTEXT = "rocebus 2026-12 orders admission"
TAG_LEN = 16


def tag(key, parts):
    """rocebus::auth::Key::tag: each part prefixed by its length (u64 LE)."""
    return keyed_hash(key, b"".join(struct.pack("<Q", len(p)) + p for p in parts))[:TAG_LEN]


def trailer_value(seq, word0):
    return ((((seq * 0x9E3779B97F4A7C15) & M64) ^ word0) * 0xD6E8FEB86659FD93
            & M64) ^ 0x5EA1ED0FF5E70000


def header_word(length, stream, msg_type):
    return length | stream << 32 | msg_type << 48


def frame_len(payload):
    return (8 + payload + 8 + 15) & ~15


def frame(seq, stream, msg_type, payload):
    w0 = header_word(len(payload), stream, msg_type)
    n = frame_len(len(payload))
    body = struct.pack("<Q", w0) + payload
    return body.ljust(n - 8, b"\0") + struct.pack("<Q", trailer_value(seq, w0))


def control_word(v):
    return struct.pack("<QQ", v & M64, ~v & M64)


HELLO_MAGIC = b"RBO4"
CONTROL_LEN, PROOF_OFF, CREDIT_OFF = 64, 32, 0
PROOF_SEAL = b"RBPROOF1"
FLAG_FANIN = 1


def hello(log2, ring_addr, rkey, max_payload, conn_id):
    return HELLO_MAGIC + struct.pack("<HHQII", log2, 0, ring_addr, rkey, max_payload) + conn_id


def self_test():
    # auth.rs `tags_are_pinned_to_their_wire_definition`.
    k = derive_key(ORDERS_CONTEXT, b"pinned secret")
    got = tag(k, [b"responder", bytes([1] * 16), bytes([2] * 16), b"ctx"])
    want = bytes([109, 167, 136, 195, 2, 39, 79, 147, 245, 157, 21, 207, 252, 236, 25, 16])
    assert got == want, (got.hex(), want.hex())
    # frame.rs fixed bytes: frame 1, 5 payload bytes 1..=5, stream 7, type 3.
    f = frame(1, 7, 3, bytes([1, 2, 3, 4, 5]))
    assert f == bytes([5, 0, 0, 0, 7, 0, 3, 0, 1, 2, 3, 4, 5] + [0] * 11
                      + [48, 13, 22, 192, 12, 203, 39, 127]), f.hex()


# ------------------------------------------------------------------ verbs
MODES = ["badlen", "reserved", "midpadding", "pastring", "badseal", "seqjump",
         "zeros", "creditbeyond", "creditjunk"]
LOG2 = 13  # our ring: 8 KiB (the listener's frames of up to 1 KiB fit four times)


class Timeout(Exception):
    pass


def on_alarm(_sig, _frame):
    raise Timeout()


def wait_event(ch, seconds):
    import pyverbs.cm_enums as ce
    from pyverbs.cmid import CMEvent
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        ev = CMEvent(ch)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    kind = ev.event_type
    data = b""
    if kind in (ce.RDMA_CM_EVENT_REJECTED, ce.RDMA_CM_EVENT_ESTABLISHED):
        try:
            data = bytes(ev.private_data or b"")
        except Exception:  # noqa: BLE001 - an event without private data
            data = b""
    ev.ack_cm_event()
    return kind, data


class Peer:
    def __init__(self, args, key):
        import pyverbs.cm_enums as ce
        import pyverbs.enums as e
        from pyverbs.cmid import AddrInfo, CMEventChannel, CMID, ConnParam
        from pyverbs.qp import QPCap, QPInitAttr
        self.e = e
        self.ce = ce
        self.ch = CMEventChannel()
        self.cmid = CMID(creator=self.ch, port_space=ce.RDMA_PS_TCP)
        ai = AddrInfo(src=args.src, dst=args.dst, dst_service=str(args.port),
                      port_space=ce.RDMA_PS_TCP)
        self.cmid.resolve_addr(ai, 2000)
        self.expect(ce.RDMA_CM_EVENT_ADDR_RESOLVED)
        self.cmid.resolve_route(2000)
        self.expect(ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
        cap = QPCap(max_send_wr=16, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.cmid.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap))
        # Our ring (the listener writes its frames and its credit into it)
        # and our own staging for the writes we post.
        self.ring = self.cmid.reg_write((1 << LOG2) + CONTROL_LEN)
        self.staging = self.cmid.reg_msgs(1 << 16)
        ni = os.urandom(8) + struct.pack("<Q", time.time_ns())
        mine = hello(LOG2, self.ring.buf, self.ring.rkey, 1024, ni[:8])
        first = tag(key, [b"initiator first", ni, mine, b""])
        # rdma-core 44's ConnParam needs data_len set, or sends nothing.
        param = ConnParam(data_len=56)
        param.set_private_data(mine + ni[8:] + first)
        self.cmid.connect(param)
        kind, back = wait_event(self.ch, 10)
        if kind != ce.RDMA_CM_EVENT_ESTABLISHED:
            raise RuntimeError("not admitted: event %d, %s" % (kind, back.hex()))
        theirs, nr, tr = back[:32], back[32:48], back[48:64]
        if theirs[:4] != HELLO_MAGIC:
            raise RuntimeError("accept reply is not an RBO4 hello: %s" % back.hex())
        ctx = mine + theirs
        if struct.unpack("<H", theirs[6:8])[0] & FLAG_FANIN:
            ctx += back[64:80]
        if tag(key, [b"responder", ni, nr, ctx]) != tr:
            raise RuntimeError("the listener's proof is wrong")
        ti = tag(key, [b"initiator", ni, nr, ctx])
        log2, _, self.raddr, self.rkey, self.max_payload = struct.unpack("<HHQII", theirs[4:24])
        self.size = 1 << log2
        self.write(self.size + PROOF_OFF, ti + PROOF_SEAL + bytes(8))

    def expect(self, want):
        kind, back = wait_event(self.ch, 5)
        if kind != want:
            raise RuntimeError("event %d, expected %d (%s)" % (kind, want, back.hex()))

    def write(self, off, data):
        """One RDMA WRITE of `data` to the listener's ring at `off`, waited for."""
        self.staging.write(data, len(data))
        self.cmid.post_write(self.staging, len(data), self.raddr + off, self.rkey,
                             self.e.IBV_SEND_SIGNALED)
        wc = self.cmid.get_send_comp()
        if wc is None or wc.status != 0:
            raise RuntimeError("write failed: %s" % (wc.status if wc else "no completion"))

    def attack(self, mode):
        good = frame(1, 1, 1, b"pyverbs!")
        self.write(0, good)
        print("admitted %s" % mode, flush=True)
        at, seq = len(good), 2
        if mode == "badlen":
            self.write(at, frame(seq, 1, 1, bytes(2000)))
        elif mode == "reserved":
            self.write(at, frame(seq, 1, 0xFF10, b"reserved"))
        elif mode == "midpadding":
            self.write(at, frame(seq, 0, 0xFFFF, b""))
        elif mode == "pastring":
            w0 = header_word(self.size * 2, 1, 1)
            self.write(at, struct.pack("<Q", w0) + os.urandom(56))
        elif mode == "badseal":
            f = bytearray(frame(seq, 1, 1, b"badseal!"))
            f[-8:] = os.urandom(8)
            self.write(at, bytes(f))
        elif mode == "seqjump":
            self.write(at, frame(seq + 999_000, 1, 1, b"seqjump!"))
        elif mode == "zeros":
            self.write(at, bytes(4096))
        elif mode == "creditbeyond":
            self.write(self.size + CREDIT_OFF, control_word(1 << 40))
        elif mode == "creditjunk":
            self.write(self.size + CREDIT_OFF, os.urandom(16))
        else:
            raise ValueError(mode)
        print("attacked %s" % mode, flush=True)

    def wait_closed(self, seconds):
        """Whether the listener disconnected within `seconds` (standard input
        closing ends the wait early)."""
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            ready, _, _ = select.select([sys.stdin.fileno()], [], [], 0)
            if ready and not os.read(sys.stdin.fileno(), 4096):
                return False
            try:
                kind, _ = wait_event(self.ch, 0.3)
            except Exception:  # noqa: BLE001 - the alarm: nothing happened yet
                continue
            if kind == self.ce.RDMA_CM_EVENT_DISCONNECTED:
                return True
        return False

    def close(self):
        try:
            self.cmid.close()
            self.ch.close()
        except Exception:  # noqa: BLE001 - going away anyway
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dst")
    ap.add_argument("--src")
    ap.add_argument("--port", type=int)
    ap.add_argument("--token", default="test-token")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--hold", type=float, default=30.0,
                    help="seconds to wait for the listener to drop each connection")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    self_test()
    if args.self_test:
        print("self-test ok", flush=True)
        return
    signal.signal(signal.SIGALRM, on_alarm)
    key = derive_key(ORDERS_CONTEXT, args.token.encode())
    report = {}
    for mode in args.modes.split(","):
        r = {"admitted": False, "attacked": False, "closed_by_listener": False, "error": ""}
        report[mode] = r
        peer = None
        try:
            peer = Peer(args, key)
            r["admitted"] = True
            peer.attack(mode)
            r["attacked"] = True
            r["closed_by_listener"] = peer.wait_closed(args.hold)
            if r["closed_by_listener"]:
                print("closed %s" % mode, flush=True)
        except Exception as ex:  # noqa: BLE001 - reported
            r["error"] = repr(ex)
        finally:
            if peer is not None:
                peer.close()
    print("done", flush=True)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
