#!/bin/busybox sh
# /init of the `cargo xtask vm-test` initramfs. xtask replaces the @@...@@ placeholders.
# Mounts the host root read-only over 9p at /host, gives it fresh kernel filesystems and writable
# tmpfs scratch space, runs each test binary chrooted into it, and reports on the serial console
# with `@@TRACER-VM` markers that xtask parses. Always ends with `reboot -f` (qemu -no-reboot exits).
/bin/busybox --install -s /bin
export PATH=/bin

marker() { echo; echo "@@TRACER-VM $*"; }
setup_failed() { marker "SETUP-FAILED $*"; reboot -f; }
must() { "$@" || setup_failed "$*"; }

must mount -t proc proc /proc
must mount -t devtmpfs devtmpfs /dev
must mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host
must mount -t proc proc /host/proc
must mount -t sysfs sysfs /host/sys
must mount -t tracefs tracefs /host/sys/kernel/tracing
must mount -t debugfs debugfs /host/sys/kernel/debug
must mount -t bpf bpf /host/sys/fs/bpf
must mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
must mount -t devtmpfs devtmpfs /host/dev
must mkdir -p /host/dev/pts /host/dev/shm
must mount -t devpts devpts /host/dev/pts
must mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm
# The workspace (test binaries, fixtures) may itself live under /tmp or /run, which get fresh
# tmpfs mounts below: set it aside and put it back at the same path on top of them.
workspace=@@WORKSPACE@@
must mkdir -p /workspace
must mount -o bind "/host$workspace" /workspace
must mount -t tmpfs -o mode=1777 tmpfs /host/tmp
must mount -t tmpfs -o mode=755 tmpfs /host/run
must mkdir -p "/host$workspace"
must mount -o bind /workspace "/host$workspace"
ip link set lo up
hostname tracer-vm

marker "BOOTED kernel=$(uname -r) cpus=$(nproc)"

# run_test NAME CWD BINARY ARGS...: runs BINARY chrooted in /host, from CWD, with a clean environment.
run_test() {
	name=$1
	shift
	marker "START $name"
	env -i @@ENV@@ chroot /host /bin/sh -c 'cd "$1" && shift && exec "$@"' vm-test "$@"
	status=$?
	marker "END $name status=$status"
}

@@TESTS@@
marker DONE
reboot -f
