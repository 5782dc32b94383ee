//! The sandbox's layout, as the host and the supervisor (native, or a
//! microVM guest's) both know it: which host directories it is built from,
//! what of the host's `/etc` it sees, the descriptor the control channel
//! arrives on, and the names a microVM's shares go by.
//!
//! guest/init.rs is built on its own (see build.rs) and cannot use this
//! module: it repeats [`CONTROL_FD`] and the names of [`GUEST_BIN`]'s
//! files (a test holds them equal).

/// The descriptor on which the supervisor finds its control channel: the
/// native supervisor from the host, QEMU's virtio serial port from it, and
/// the guest's supervisor from the guest init.
pub(crate) const CONTROL_FD: i32 = 3;

/// The descriptor on which the native supervisor finds the host's services
/// channel, when its setup asks for a service (the broker's listener goes
/// back over it); closed otherwise.
pub(crate) const SERVICES_FD: i32 = CONTROL_FD + 1;

/// The serial numbers of a microVM's disks when its root is an image: the
/// image's flat root (read-only) and the guest's writable layer. The guest
/// finds each by its serial, whatever order the kernel probed them in.
pub(crate) const IMAGE_DISK: &str = "cordon-image";
pub(crate) const UPPER_DISK: &str = "cordon-upper";

/// Where a microVM guest's init mounts cordon's own disk, a read-only
/// ext4 file system (made by microvm/stage.rs) holding the supervisor as
/// [`GUEST_SUPERVISOR`], the dynamic loader it names as [`GUEST_LOADER`]
/// and the libraries it links in [`GUEST_LIBS`]: init starts the
/// supervisor before any share is mounted (a snapshot holds it running,
/// and QEMU saves no guest with a 9p share mounted), so nothing of it may
/// come from a share.
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "init mounts it; a test holds init's spelling equal"
    )
)]
pub(crate) const GUEST_BIN: &str = "/.cordon/bin";
pub(crate) const GUEST_SUPERVISOR: &str = "supervisor";
pub(crate) const GUEST_LOADER: &str = "ld.so";
pub(crate) const GUEST_LIBS: &str = "lib";

/// Modules of a microVM guest that its supervisor loads after its hold,
/// not init before: a block device's driver reads its capacity when it
/// binds, and each start has disks of its own.
pub(crate) const GUEST_LATE_MODULES: &[&str] = &["virtio_blk.ko"];

/// Host files a microVM guest on virtio-fs reads into its page cache before
/// it holds (once its `/usr` is mounted): the loader, the C library and the
/// programs commands start with, so that a guest started from its snapshot
/// does not read them over its share first. Those a host lacks are skipped.
/// The snapshot's shape holds each one's identity on the host: an upgrade
/// that replaces one makes a new snapshot, never a guest with a stale copy.
pub(crate) const GUEST_WARM: &[&str] = &[
    "/usr/lib64/ld-linux-x86-64.so.2",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libtinfo.so.6",
    "/usr/lib/ld-linux-aarch64.so.1",
    "/usr/lib/aarch64-linux-gnu/libc.so.6",
    "/usr/lib/aarch64-linux-gnu/libtinfo.so.6",
    "/usr/bin/sh",
    "/usr/bin/bash",
    "/usr/bin/true",
];

/// Where a guest's initramfs holds its modules and `order`, the file
/// names in load order.
pub(crate) const GUEST_MODULES: &str = "/.cordon/modules";

/// A microVM guest's start handshake, which its supervisor speaks before
/// its setup (see microvm/snapshot.rs): the guest writes [`HOLD_READY`]
/// when it holds, the host answers [`HOLD_GO`] and [`HOLD_SEED_LEN`]
/// random bytes, the guest [`HOLD_ACK`] once they are in its kernel's pool.
pub(crate) const HOLD_READY: &[u8; 8] = b"cordon:R";
pub(crate) const HOLD_GO: &[u8; 8] = b"cordon:G";
pub(crate) const HOLD_ACK: &[u8; 8] = b"cordon:A";
pub(crate) const HOLD_SEED_LEN: usize = 32;

/// Host system directories bound read-only (or recreated as symlinks, on
/// merged-/usr systems). Enough for coreutils, python3, node, gcc and git.
pub(crate) const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Entries of the host's `/etc` that programs need and that hold no secrets.
/// `/etc` is never bound whole: it holds shadow files, TLS private keys, SSH
/// host keys and package-manager credentials, which a sandbox whose uid maps
/// to the host's owner of those files could otherwise read.
pub(crate) const ETC_ALLOW: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "fonts",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "locale.gen",
    "localtime",
    "magic",
    "magic.mime",
    // Debian's matplotlib looks for its defaults here.
    "matplotlibrc",
    "mime.types",
    "mtab",
    "networks",
    "nsswitch.conf",
    "os-release",
    "perl",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
    "vim",
    "X11",
    "xdg",
    "xml",
];

/// The system's fontconfig cache, shared read-only with every sandbox.
pub(crate) const FONT_CACHE: &str = "/var/cache/fontconfig";

/// The 9p tag under which the host shares extra bind `i` with a microVM.
pub(crate) fn bind_tag(i: usize) -> String {
    format!("bind{i}")
}
