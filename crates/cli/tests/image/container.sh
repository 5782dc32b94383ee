# Runs a command in an unpacked image as a container runtime would: fresh
# mount, pid, ipc, uts and cgroup namespaces (made by the caller with
# unshare) and the host's network; a writable layer over the image's root
# (overlayfs, so the unpacked image stays as it is; see below for the user
# namespace); /proc, /dev, /sys and
# the cgroup file systems mounted; the data volume bound at
# /var/lib/cordon; the root pivoted; the image's user, working directory
# and environment.
# Arguments: ROOTFS LAYER DATA USERNS(0|1) UID GID CWD NAME=VALUE... ARGV...
# (LAYER: an empty directory for the writable layer; the environment ends,
# as env(1) takes it, at the first word without =).
set -eu
image=$1 layer=$2 data=$3 userns=$4 uid=$5 gid=$6 cwd=$7
shift 7

mount --make-rprivate /
root=$layer/root
mkdir "$root"
if [ "$userns" = 1 ]; then
    # The image's files belong to the host's uids, of which this namespace
    # maps one (the image's user's): overlayfs cannot copy up a directory
    # whose owner it does not map (EOVERFLOW), so this container writes
    # into the unpacked image itself, where its user owns only its data
    # and the microvm cache, and gets a tmpfs as its world-writable /tmp.
    # (A rootless runtime shifts the image's owners into its namespace.)
    mount --bind "$image" "$root"
    mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/tmp"
else
    mkdir "$layer/upper" "$layer/work"
    mount -t overlay overlay -o "lowerdir=$image,upperdir=$layer/upper,workdir=$layer/work" "$root"
fi
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
    # namespace's root (the unprivileged host user who started it).
    exec unshare --user --map-user="$uid" --map-group="$gid" -- \
        setpriv --no-new-privs -- env -i "$@"
else
    exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs \
        --bounding-set=-all,+kill,+audit_write,+net_bind_service -- env -i "$@"
fi
