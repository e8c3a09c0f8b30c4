# The rocebus demo pipeline on one host (a soft-RoCE guest, or a host with an RDMA device):
#
#   feed-handler replay (the exchange: MoldUDP64 over UDP multicast)
#     -> feed-handler run (books -> normalized market data on rocebus UD multicast, and with
#        DEMO_MARKET_DATA=ipc also on shared-memory streams, which the engine then reads)
#     -> sample-engine (strategy; orders on a fixed schedule over RC)
#     -> order-gateway run (risk, journal, FIX 4.4) -> venue (simulator or QuickFIX)
#     -> acks and fills back to sample-engine
#
# Run by `cargo xtask demo` (in the guest) and by bench/tests/demo_pipeline.rs. Inputs, as
# environment variables:
#   DEMO_BIN      folder with feed-handler, order-gateway, sample-engine and rocebus
#   DEMO_ROOT     the workspace root (configs/demo/ is read from there)
#   DEMO_DAY      the ITCH 5.0 BinaryFILE to replay
#   DEMO_OUT      where logs, counters snapshots and the report go
#   DEMO_SECONDS  seconds of trading (default 30)
#   DEMO_RATE     ITCH messages per second replayed (default 2000)
#   DEMO_VENUE    sim (default) or quickfix
#   DEMO_ORDER_RATE  orders per second (default: the engine config's)
#   DEMO_MARKET_DATA rdma (default: the engine reads the UD multicast bus) or ipc (the feed
#                 handler also publishes on shared memory, the engine reads that instead)
#   DEMO_ADDR     this host's address on the RDMA device (default $ROCEBUS_GUEST_ADDR)
#   DEMO_PYTHON   the python with quickfix (for DEMO_VENUE=quickfix)
# The engine's progress lines go to stdout; everything else to DEMO_OUT/*.log. Exits with
# the engine's status (non-zero also when a component died early).
set -u
: "${DEMO_BIN:?}" "${DEMO_ROOT:?}" "${DEMO_DAY:?}" "${DEMO_OUT:?}"
SECONDS_=${DEMO_SECONDS:-30}
RATE=${DEMO_RATE:-2000}
VENUE=${DEMO_VENUE:-sim}
MARKET_DATA=${DEMO_MARKET_DATA:-rdma}
case "$MARKET_DATA" in
    rdma|ipc) ;;
    *) echo "demo: DEMO_MARKET_DATA must be rdma or ipc, not $MARKET_DATA"; exit 2 ;;
esac
ADDR=${DEMO_ADDR:-${ROCEBUS_GUEST_ADDR:-198.18.0.1}}
WORK=$(mktemp -d /tmp/rocebus-demo.XXXXXX)
export ROCEBUS_DIR="$WORK/counters"
export RUST_LOG="${RUST_LOG:-warn}"
mkdir -p "$ROCEBUS_DIR" "$DEMO_OUT"
pids=""

stop_all() {
    for p in $pids; do kill -INT "$p" 2>/dev/null; done
    sleep 1
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap stop_all EXIT
die() {
    echo "demo: $*"
    for f in "$DEMO_OUT"/*.log; do
        [ -s "$f" ] || continue
        echo "demo: --- last lines of $(basename "$f")"
        # Without the frames of a backtrace, which would push the error itself out.
        grep -v -e '^ *[0-9][0-9]*: ' -e '^ *at ' "$f" | tail -n 15
    done
    exit 1
}
alive() { kill -0 "$1" 2>/dev/null; }

# The configs name the first guest's address; on another host they are rewritten to ours,
# and every writable path points into $WORK (the host's files may be read-only).
gw_name=order-gateway
[ "$VENUE" = quickfix ] && gw_name=order-gateway-quickfix
for f in feed-handler sample-engine $gw_name; do
    sed -e "s/198\.18\.0\.1/$ADDR/g" -e "s#/tmp/rocebus-demo#$WORK#g" \
        "$DEMO_ROOT/configs/demo/$f.toml" > "$WORK/$f.toml" || die "cannot read configs/demo/$f.toml"
done
gw_config="$WORK/$gw_name.toml"
if [ "$MARKET_DATA" = ipc ]; then
    # The configs carry the two lines commented out: the feed handler's publish.ipc_stream
    # and the engine's market_data.transport (the engine takes the stream names from the
    # feed handler's config, which it reads anyway).
    sed -i -e 's/^#ipc_stream = /ipc_stream = /' "$WORK/feed-handler.toml"
    sed -i -e 's/^#transport = "ipc"/transport = "ipc"/' "$WORK/sample-engine.toml"
    grep -q '^ipc_stream = ' "$WORK/feed-handler.toml" \
        || die "configs/demo/feed-handler.toml has no '#ipc_stream = ' line to enable"
    grep -q '^transport = "ipc"' "$WORK/sample-engine.toml" \
        || die "configs/demo/sample-engine.toml has no '#transport = \"ipc\"' line to enable"
    # The streams' folder, private to this user (rocebus::ipc refuses one others can write):
    # in /dev/shm where there is one; the guest's /dev (devtmpfs) has no shm folder, so there
    # they go in this run's scratch folder (a tmpfs in the guest).
    ipc_dir="/dev/shm/rocebus-ipc-$(id -u)"
    if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
        ipc_dir="$WORK/ipc"
        mkdir -p -m 700 "$ipc_dir"
    fi
    printf '\n[ipc]\ndir = "%s"\nflow = "drop"\n' "$ipc_dir" >> "$WORK/feed-handler.toml"
fi
if [ "$VENUE" = quickfix ]; then
    # The venue runs until its stdin closes: feed it a pipe this script holds open.
    mkfifo "$WORK/venue.stdin"
    "${DEMO_PYTHON:-python3}" "$DEMO_ROOT/order-gateway/venue/venue.py" --port 9878 \
        --dir "$WORK/venue" --sender VENUE --target GW < "$WORK/venue.stdin" > "$DEMO_OUT/venue.log" 2>&1 &
    venue=$!; pids="$pids $venue"
    exec 3> "$WORK/venue.stdin"
    i=0
    until grep -q READY "$DEMO_OUT/venue.log" 2>/dev/null; do
        alive $venue || die "the QuickFIX venue exited"
        i=$((i + 1)); [ $i -lt 300 ] || die "the QuickFIX venue did not start in 30 s"
        sleep 0.1
    done
fi

# What the report states beside its figures: the conditions of the run, and this host's
# raw-verbs floor measured just before it (perftest, 64 B, one-way): one RDMA WRITE
# (ib_write_lat, what an orders hop is) and one UD send (ib_send_lat -c UD, what a
# market-data hop is), in the same guest, with nothing else running.
{
    echo "vcpus=$(nproc)"
    echo "market_data=$MARKET_DATA"
    for f in feed-handler sample-engine $gw_name; do
        echo "idle.$f=$(grep -m1 '^idle' "$WORK/$f.toml" | sed -e 's/^idle *= *//')"
    done
} > "$DEMO_OUT/conditions.txt"
floor() { # tool, its extra arguments, output file
    if ! command -v "$1" > /dev/null 2>&1; then
        echo "$1 is not installed (perftest)" > "$DEMO_OUT/$3"
        return
    fi
    dev=${ROCEBUS_RDMA_DEVICE:-$(ls /sys/class/infiniband | head -n 1)}
    gid=${ROCEBUS_GID_INDEX:-1}
    timeout 60 "$1" -d "$dev" -x "$gid" -s 64 -n 2000 $2 > "$WORK/$3.server" 2>&1 &
    srv=$!
    for t in 1 2 3 4 5 6 7 8 9 10; do
        sleep 1
        timeout 60 "$1" -d "$dev" -x "$gid" -s 64 -n 2000 $2 "$ADDR" > "$DEMO_OUT/$3" 2>&1 && break
    done
    wait $srv
}
echo "demo: measuring this host's raw-verbs floor (ib_write_lat, ib_send_lat -c UD; 64 B)"
floor ib_write_lat "" floor-write.txt
floor ib_send_lat "-c UD" floor-send.txt

echo "demo: starting feed-handler, order-gateway ($VENUE venue), sample-engine (market data over $MARKET_DATA); replaying $(basename "$DEMO_DAY") at $RATE msg/s; $SECONDS_ s of trading"
# The feed handler first: the gateway subscribes to its bus for reference prices and halts.
"$DEMO_BIN/feed-handler" run --config "$WORK/feed-handler.toml" > "$DEMO_OUT/feed-handler.log" 2>&1 &
fh=$!; pids="$pids $fh"
sleep 1
alive $fh || die "feed-handler exited at start"
gw_venue=sim
[ "$VENUE" = quickfix ] && gw_venue=fix
"$DEMO_BIN/order-gateway" run --venue $gw_venue --config "$gw_config" > "$DEMO_OUT/order-gateway.log" 2>&1 &
gw=$!; pids="$pids $gw"
sleep 1
alive $gw || die "order-gateway exited at start"

"$DEMO_BIN/sample-engine" --config "$WORK/sample-engine.toml" --seconds "$SECONDS_" \
    ${DEMO_ORDER_RATE:+--orders-per-second "$DEMO_ORDER_RATE"} \
    --out "$DEMO_OUT/report" --floor-write "$DEMO_OUT/floor-write.txt" \
    --floor-send "$DEMO_OUT/floor-send.txt" 2> "$DEMO_OUT/sample-engine.log" &
engine=$!; pids="$pids $engine"
# The exchange opens once the engine is subscribed and logged on (its counters appear then).
i=0
until [ -e "$ROCEBUS_DIR/sample-engine.counters" ]; do
    alive $engine || die "sample-engine exited before trading"
    i=$((i + 1)); [ $i -lt 600 ] || die "sample-engine did not connect in 60 s"
    sleep 0.1
done
"$DEMO_BIN/feed-handler" replay "$DEMO_DAY" --group 239.1.1.1:26477 --rate "$RATE" \
    --retrans-port 26478 > "$DEMO_OUT/replay.log" 2>&1 &
replay=$!; pids="$pids $replay"
echo "demo: $(date +%T) the engine is trading; the exchange opened"

# Mid-run: read every component's counters from this other process, as an operator would.
sleep $((SECONDS_ / 2))
if alive $engine; then
    "$DEMO_BIN/rocebus" stat --once > "$DEMO_OUT/stat.txt" 2>&1
    "$DEMO_BIN/rocebus" stat --prometheus > "$DEMO_OUT/stat.prom" 2>&1
    echo "demo: $(date +%T) rocebus stat read $(grep -vc '^#' "$DEMO_OUT/stat.prom") metrics of the running components"
    # The operator's view of the gateway, through its control socket.
    "$DEMO_BIN/order-gateway" control --config "$gw_config" status > "$DEMO_OUT/gateway-status.txt" 2>&1 \
        && echo "demo: $(date +%T) order-gateway control status: $(grep -m1 '^open orders' "$DEMO_OUT/gateway-status.txt")"
fi
wait $engine
status=$?
alive $gw || echo "demo: order-gateway died during the run (see order-gateway.log)"
alive $fh || echo "demo: feed-handler died during the run (see feed-handler.log)"
cat "$DEMO_OUT/sample-engine.log" >&2
if [ $status -ne 0 ] && alive $gw; then
    # The engine gave up on a gateway still running: what the gateway was doing then.
    echo "demo: --- the running components' counters (rocebus stat)"
    "$DEMO_BIN/rocebus" stat --once 2>&1 | grep -v -e ' 0 *-$' | head -n 80
    if command -v rdma > /dev/null; then
        # Each queue pair's state and PSNs: a stalled or failed connection shows here.
        echo "demo: --- the RDMA device's queue pairs (rdma resource show qp)"
        rdma resource show qp 2>&1 | head -n 40
    fi
    echo "demo: --- the kernel's last messages"
    dmesg 2>/dev/null | tail -n 20
    if command -v gdb > /dev/null; then
        echo "demo: --- the order gateway's threads (gdb)"
        # Bounded: attaching to a process in a starved guest can take minutes.
        timeout 30 gdb -batch -p $gw -ex 'thread apply all bt 12' 2>/dev/null | grep -e '^Thread' -e '^#' | head -n 120
    fi
fi
[ $status -eq 0 ] || die "sample-engine failed with status $status"
exit 0
