#!/usr/bin/python3
"""A stranger on the fabric flooding an rdma_cm listener, built from raw
verbs with Debian's python3-pyverbs (rdma-core), not from rocebus.

For each local address given (`--src`, one process each), it connects to
`--dst`:`--port` as fast as it can, each time with a new rdma_cm id, queue
pair and event channel, sending as the connect request's private data in
turn:
  replay   the captured request given in `--replay` (hex), byte for byte;
  forged   the captured request with its 16-byte proof replaced by random
           bytes (a well-formed hello that proves nothing);
  renonced the captured request with one byte of its nonce flipped (the
           proof no longer covers it);
  garbage  0 to 56 random bytes.
Whatever the listener answers is kept (a connection it established stays
open, holding whatever the listener gave it) until the flood stops: when
standard input closes, or after `--seconds`.

It prints `flooding` once the first answer came back, a line `progress
N` for every 50 attempts (N = 50, 100, ...), and at the end one JSON
object: per kind and in total, `attempts`, `silenced` (rejected with private data all zero),
`answered` (established, or rejected with any non-zero private data: a
reason, a cookie, a proof), `errors` (timeouts, unreachable, failures of
its own verbs) and the first unexpected outcome.

Run it with Debian's interpreter (/usr/bin/python3): the python3 first on
a machine's PATH may be another build that does not see python3-pyverbs.
"""

import argparse
import json
import os
import select
import signal
import sys
import time

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.cmid import AddrInfo, CMEvent, CMEventChannel, CMID, ConnParam
from pyverbs.qp import QPCap, QPInitAttr

KINDS = ["replay", "forged", "renonced", "garbage"]
FIELDS = ["attempts", "silenced", "answered", "errors"]
# The orders connect request (rocebus::ring::frame::ConnectHello): a
# 32-byte hello, 8 bytes of nonce tail, a 16-byte proof.
PROOF_AT, PROOF_LEN, NONCE_AT = 40, 16, 24


class Timeout(Exception):
    pass


def on_alarm(_sig, _frame):
    raise Timeout()


def wait_event(ch, want, seconds):
    """The next event on `ch` (its type and private data), within `seconds`."""
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        ev = CMEvent(ch)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    kind = ev.event_type
    data = b""
    if kind in (ce.RDMA_CM_EVENT_REJECTED, ce.RDMA_CM_EVENT_ESTABLISHED,
                ce.RDMA_CM_EVENT_CONNECT_RESPONSE):
        try:
            data = bytes(ev.private_data or b"")
        except Exception:  # noqa: BLE001 - an event without private data
            data = b""
    ev.ack_cm_event()
    if want is not None and kind != want:
        raise RuntimeError("event %d, expected %d" % (kind, want))
    return kind, data


def private_data(kind, captured, i):
    if kind == "replay":
        return captured
    if kind == "forged":
        b = bytearray(captured)
        b[PROOF_AT:PROOF_AT + PROOF_LEN] = os.urandom(PROOF_LEN)
        return bytes(b)
    if kind == "renonced":
        b = bytearray(captured)
        b[NONCE_AT + i % 8] ^= 0x5A
        return bytes(b)
    return os.urandom(i % 57)


def attempt(src, dst, port, data, held):
    """One connect request; what came back."""
    ch = CMEventChannel()
    cmid = CMID(creator=ch, port_space=ce.RDMA_PS_TCP)
    ai = AddrInfo(src=src, dst=dst, dst_service=str(port),
                  port_space=ce.RDMA_PS_TCP)
    cmid.resolve_addr(ai, 2000)
    wait_event(ch, ce.RDMA_CM_EVENT_ADDR_RESOLVED, 5)
    cmid.resolve_route(2000)
    wait_event(ch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED, 5)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    cmid.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap))
    # rdma-core 44's ConnParam copies private data into a buffer of
    # `data_len` bytes (56: the most an RC connect request carries); without
    # it set_private_data sends nothing, silently.
    param = ConnParam(data_len=56)
    if data:
        param.set_private_data(data)
    cmid.connect(param)
    kind, back = wait_event(ch, None, 10)
    if kind == ce.RDMA_CM_EVENT_REJECTED:
        outcome = "silenced" if not any(back) else "answered"
        cmid.close()
        ch.close()
        return outcome, back
    if kind == ce.RDMA_CM_EVENT_ESTABLISHED:
        # Keep it: whatever the listener gave it stays given.
        held.append((ch, cmid))
        return "answered", back
    cmid.close()
    ch.close()
    return "errors", ("event %d" % kind).encode()


STOP = False


def on_stop(_sig, _frame):
    global STOP
    STOP = True


def worker(src, args, captured, out):
    """One source address: attempts until SIGUSR1, a line per attempt
    (`kind outcome hex-of-what-came-back`) on the pipe `out`."""
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGUSR1, on_stop)
    held = []
    i = 0
    every = len(args.src.split(",")) / args.rate if args.rate > 0 else 0.0
    next_at = time.monotonic()
    while not STOP:
        if every:
            next_at += every
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_at = time.monotonic()
        kind = KINDS[i % len(KINDS)]
        data = private_data(kind, captured, i)
        try:
            outcome, back = attempt(src, args.dst, args.port, data, held)
        except Exception as ex:  # noqa: BLE001 - counted, the flood goes on
            if STOP:
                break
            outcome, back = "errors", repr(ex).encode()
        os.write(out, ("%s %s %s\n" % (kind, outcome, back[:120].hex())).encode())
        i += 1
        del held[64:]
    for ch, cmid in held:
        try:
            cmid.close()
            ch.close()
        except Exception:  # noqa: BLE001 - going away anyway
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dst", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--src", required=True, help="local addresses, comma separated")
    ap.add_argument("--replay", required=True, help="a captured connect request, hex")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--rate", type=float, default=0.0,
                    help="attempts per second over all sources (0: as fast as they can)")
    args = ap.parse_args()
    captured = bytes.fromhex(args.replay)
    if len(captured) < PROOF_AT + PROOF_LEN:
        sys.exit("the captured request is %d bytes, not an orders connect request"
                 % len(captured))
    srcs = [s for s in args.src.split(",") if s]
    # Plain processes and pipes: multiprocessing's locks need /dev/shm,
    # which a minimal guest may not have.
    workers = {}
    for src in srcs:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                worker(src, args, captured, w)
            except BaseException:  # noqa: BLE001 - reported by the exit code
                code = 1
            os._exit(code)
        os.close(w)
        workers[r] = (pid, b"")
    tally = {k: dict.fromkeys(FIELDS, 0) for k in KINDS}
    first_unexpected = ""
    t0 = time.monotonic()
    said, shown, stop_at = False, 0, None
    watch = list(workers) + [sys.stdin.fileno()]
    while workers:
        if stop_at is None and time.monotonic() - t0 >= args.seconds:
            stop_at = time.monotonic()
        if stop_at is not None:
            if sys.stdin.fileno() in watch:
                watch.remove(sys.stdin.fileno())
                for pid, _ in workers.values():
                    os.kill(pid, signal.SIGUSR1)
            if time.monotonic() - stop_at > 20:
                for pid, _ in workers.values():
                    os.kill(pid, signal.SIGKILL)
        ready, _, _ = select.select(watch, [], [], 0.05)
        for fd in ready:
            if fd == sys.stdin.fileno():
                if not os.read(fd, 4096):
                    stop_at = time.monotonic()
                continue
            chunk = os.read(fd, 65536)
            pid, buf = workers[fd]
            if not chunk:
                os.waitpid(pid, 0)
                os.close(fd)
                watch.remove(fd)
                del workers[fd]
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            workers[fd] = (pid, buf)
            for line in lines:
                kind, outcome, back = (line.decode().split(" ") + [""])[:3]
                tally[kind]["attempts"] += 1
                tally[kind][outcome] += 1
                unexpected = outcome == "errors" or (outcome == "answered" and kind != "replay")
                if unexpected and not first_unexpected:
                    what = bytes.fromhex(back)
                    if outcome == "errors":
                        what = what.decode(errors="replace")
                    first_unexpected = "%s: %s: %s" % (kind, outcome, what)
        n = sum(t["attempts"] for t in tally.values())
        decided = n - sum(t["errors"] for t in tally.values())
        if not said and decided > 0:
            print("flooding", flush=True)
            said = True
        while n // 50 > shown:
            shown += 1
            print("progress %d" % (shown * 50), flush=True)
    total = dict.fromkeys(FIELDS, 0)
    for t in tally.values():
        for f in FIELDS:
            total[f] += t[f]
    print(json.dumps({
        "sources": srcs,
        "by_kind": tally,
        "total": total,
        "first_unexpected": first_unexpected,
        "seconds": round(time.monotonic() - t0, 3),
    }), flush=True)


if __name__ == "__main__":
    main()
