# rocebus per-guest script, run by the guest's init inside a chroot of the
# host's root. `cargo xtask vm` prepends the variables it needs:
#   ROCEBUS_GUEST_INDEX ROCEBUS_HOSTS ROCEBUS_GUEST_ADDR ROCEBUS_PEER_ADDR
#   ROCEBUS_OUT ROCEBUS_NETEM ROCEBUS_CWD ROCEBUS_CMD
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LANG=C.UTF-8
export ROCEBUS_IN_GUEST=1 ROCEBUS_RDMA_DEVICE=rxe0 ROCEBUS_GID_INDEX=1

fail() {
    echo "rocebus-guest: $*"
    echo 125 > "$ROCEBUS_OUT/status"
    exit 125
}

ip link set lo up
ip link set eth0 up || fail "no eth0 (virtio_net not loaded?)"
ip addr add "$ROCEBUS_GUEST_ADDR/24" dev eth0
ip route add 224.0.0.0/4 dev eth0
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 failed"
if [ -n "$ROCEBUS_NETEM" ]; then
    # shellcheck disable=SC2086 # the netem spec is a word list on purpose
    tc qdisc add dev eth0 root netem $ROCEBUS_NETEM || fail "tc netem '$ROCEBUS_NETEM' failed"
fi

# The IPv4-mapped GID (index 1) appears asynchronously after the address.
gid=/sys/class/infiniband/rxe0/ports/1/gids/1
i=0
while [ $i -lt 100 ]; do
    case "$(cat $gid 2>/dev/null)" in
        0000:0000:0000:0000:0000:ffff:*) break ;;
    esac
    i=$((i + 1)); sleep 0.05
done
[ $i -lt 100 ] || fail "rxe0 GID index 1 never became the IPv4-mapped address"

if [ "$ROCEBUS_HOSTS" -gt 1 ]; then
    # The guests boot at about the same time; wait until the link carries
    # traffic both ways before the command starts. Guest 0 (the one that
    # serves, with more than two) waits for every other guest, so a guest
    # that boots late is there before anyone waits for it.
    peers="$ROCEBUS_PEER_ADDR"
    if [ "$ROCEBUS_GUEST_INDEX" -eq 0 ] && [ "$ROCEBUS_HOSTS" -gt 2 ]; then
        peers=""
        n=2
        while [ $n -le "$ROCEBUS_HOSTS" ]; do
            peers="$peers 198.18.0.$n"
            n=$((n + 1))
        done
    fi
    for peer in $peers; do
        i=0
        until busybox ping -c 1 -W 1 "$peer" >/dev/null 2>&1; do
            i=$((i + 1))
            [ $i -lt 240 ] || fail "peer $peer unreachable after 240 s"
        done
    done
fi

echo "rocebus-guest $ROCEBUS_GUEST_INDEX: rxe0 up at $ROCEBUS_GUEST_ADDR (GID index 1)${ROCEBUS_NETEM:+, netem $ROCEBUS_NETEM}"
cd "$ROCEBUS_CWD" || fail "cannot cd to $ROCEBUS_CWD"
sh -c "$ROCEBUS_CMD" </dev/null 2>&1
echo $? > "$ROCEBUS_OUT/status"
