# Runs a command in an unpacked image as a container runtime would: fresh
# mount, pid, ipc, uts and cgroup namespaces (made by the caller with
# unshare) and the host's network; /proc, /dev, /sys and the cgroup file
# systems mounted; the data volume bound at /var/lib/cordon; the root
# pivoted; the image's user, working directory and environment.
# Arguments: ROOTFS DATA USERNS(0|1) UID GID CWD NAME=VALUE... ARGV...
# (as env(1) takes them: the environment ends at the first word without =).
set -eu
root=$1 data=$2 userns=$3 uid=$4 gid=$5 cwd=$6
shift 6

mount --make-rprivate /
mount --bind "$root" "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,mode=755,size=65536k tmpfs "$root/dev"
for d in null zero full random urandom tty; do
    : >"$root/dev/$d"
    mount --bind "/dev/$d" "$root/dev/$d"
done
mkdir "$root/dev/pts" "$root/dev/shm" "$root/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
# What the runtime's writable layer would take: the unpacked root stays
# as the image made it, for the next container.
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/tmp"
if [ "$userns" = 1 ]; then
    # sysfs belongs to the network namespace, which is the host's: a user
    # namespace may only bind it (as rootless runtimes do with the host's
    # network).
    mount --rbind /sys "$root/sys"
else
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
    mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
fi
# Name resolution as the host has it (the host's network).
for f in resolv.conf hosts; do
    [ -e "/etc/$f" ] || continue
    [ -e "$root/etc/$f" ] || touch "$root/etc/$f" 2>/dev/null || continue
    mount --bind "/etc/$f" "$root/etc/$f"
done
mount --bind "$data" "$root/var/lib/cordon"
cd "$root"
pivot_root . mnt
umount -l /mnt
cd "$cwd"
if [ "$userns" = 1 ]; then
    # The image's user in a user namespace of its own, mapped onto this
    # namespace's root (the unprivileged host user).
    exec unshare --user --map-user="$uid" --map-group="$gid" -- \
        setpriv --no-new-privs -- env -i "$@"
else
    exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs \
        --bounding-set=-all,+kill,+audit_write,+net_bind_service -- env -i "$@"
fi
