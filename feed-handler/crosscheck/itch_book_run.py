"""Runs itch-book (PyPI `itch-book`) over a BinaryFILE capture, for the cross-check test and
`cargo xtask bench books`.

    itch_book_run.py bbo FILE     every top-of-book change as `feed-handler bbo`'s CSV, on stdout
    itch_book_run.py bench FILE   parse + full-depth books, no table: prints one RESULT line

Both feed the file in 8 MiB chunks, itch-book's own default (`Feed(chunk_bytes=8 << 20)`),
straight into its C++ session (`itch_book._core.Session`), which is what `itch_book.Feed`
does minus the reader thread, the gzip detection and the session-date arithmetic: the
timestamps stay nanoseconds since midnight, as in the capture.
"""

import sys
import time

CHUNK = 8 << 20


def session(tables):
    try:
        from itch_book._core import Session
    except ImportError as e:
        sys.exit(
            f"itch_book is not importable by {sys.executable} ({e}): run `cargo xtask setup`, "
            "or `pip install -r feed-handler/crosscheck/requirements.txt` into this Python"
        )
    return Session(tables=tables, depth=0, symbols=[])


def feed(s, path):
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            s.feed(chunk)
    stats = s.stats()
    if stats["messages"] == 0 or stats["pending_bytes"]:
        sys.exit(f"{path}: itch-book read {stats['messages']} messages and left "
                 f"{stats['pending_bytes']} bytes: not a whole BinaryFILE capture")
    return stats


def price(raw):
    return f"{raw // 10000}.{raw % 10000:04d}"


def side(px, sz, ct):
    # itch-book marks an empty side with price 0 (and size 0).
    return f"{price(px)},{sz},{ct}" if px else ",,"


def bbo(path):
    s = session(["bbo"])
    s.reserve(1 << 16)
    out = ["locate,timestamp,bid_price,bid_size,bid_orders,ask_price,ask_size,ask_orders"]
    rows = []
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            s.feed(chunk)
            rows.append(s.take_bbo())
    stats = s.stats()
    if stats["messages"] == 0 or stats["pending_bytes"]:
        sys.exit(f"{path}: itch-book read {stats['messages']} messages and left "
                 f"{stats['pending_bytes']} bytes: not a whole BinaryFILE capture")
    rows.append(s.take_bbo())
    for t in rows:
        cols = [t[k].tolist() for k in
                ("locate", "ts", "bid_px", "bid_sz", "bid_ct", "ask_px", "ask_sz", "ask_ct")]
        for loc, ts, bp, bs, bc, ap, as_, ac in zip(*cols):
            out.append(f"{loc},{ts},{side(bp, bs, bc)},{side(ap, as_, ac)}")
    sys.stdout.write("\n".join(out) + "\n")
    print(f"itch-book stats: {stats}", file=sys.stderr)


def thread_cpu_ns():
    """CPU time of this thread so far, as the kernel's scheduler counts it (the same source
    `feed-handler throughput` reads)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[0])


def bench(path):
    s = session([])
    cpu = thread_cpu_ns()
    start = time.perf_counter()
    stats = feed(s, path)
    secs = time.perf_counter() - start
    cpu_secs = (thread_cpu_ns() - cpu) / 1e9
    n = stats["messages"]
    print(f"RESULT msgs_per_sec={n / secs:.1f} messages={n} secs={secs:.6f} cpu_secs={cpu_secs:.6f}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("bbo", "bench"):
        sys.exit(__doc__)
    {"bbo": bbo, "bench": bench}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
