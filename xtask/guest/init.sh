#!/bin/busybox sh
# rocebus guest init (PID 1 in the initramfs built by `cargo xtask setup`).
#
# It loads the RDMA/virtio modules, mounts the host's root read-only over 9p
# and the run's writable folder, then hands over to the per-run script
# `/out/guest.sh` (written by `cargo xtask vm`), which runs inside a chroot of
# the host's root. Whatever happens, the guest powers off at the end so qemu
# exits; the host reads the command's status from the writable folder.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

while read -r mod; do
    insmod "$mod" 2>/dev/null || echo "rocebus-init: insmod $mod failed"
done < /modules.load

mkdir -p /host /out
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /host; then
    echo "rocebus-init: cannot mount the host root over 9p"
    poweroff -f
fi
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /out; then
    echo "rocebus-init: cannot mount the run folder over 9p"
    poweroff -f
fi
# The run folder appears at the same path inside the chroot as on the host,
# so paths printed by either side mean the same file.
hostpath=$(cat /out/hostpath)
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -o bind /dev /host/dev
mount -t devpts devpts /host/dev/pts 2>/dev/null
# /tmp is a fresh tmpfs, but a checkout that lives under /tmp (CI clones may)
# must stay visible: bind it aside first and put it back on top.
n=0
for p in $(cat /out/keep); do
    case "$p" in /tmp/*)
        n=$((n + 1)); mkdir -p "/keep/$n"; mount -o bind "/host$p" "/keep/$n" ;;
    esac
done
mount -t tmpfs tmpfs /host/tmp
n=0
for p in $(cat /out/keep); do
    case "$p" in /tmp/*)
        n=$((n + 1)); mkdir -p "/host$p"; mount -o bind "/keep/$n" "/host$p" ;;
    esac
done
mount -t tmpfs tmpfs /host/run
mount -t tmpfs tmpfs /host/dev/shm 2>/dev/null
mount -o bind /out "/host$hostpath"

chroot /host /bin/sh "$hostpath/guest.sh"
echo "rocebus-init: guest script ended with status $?"
sync
poweroff -f
