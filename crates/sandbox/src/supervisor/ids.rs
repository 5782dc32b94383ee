//! The id maps of a user namespace and their one writer, for the sandbox's
//! own namespace and for the helpers' (see counts.rs and idmap.rs).
//!
//! A sandbox on the host's root maps one id each way. One on an image's
//! root maps a range (0 to 65535 inside), because a distribution's files
//! and package scripts belong to several users: as root, to host ids of the
//! sandbox's own (`Allocated`); unprivileged, to the caller's id for 0 and
//! its subordinate ids for the rest, which only the setuid `newuidmap` and
//! `newgidmap` may map.

use std::fs;
use std::io::{Read, Write};

use rustix::thread::UnshareFlags;

use super::error::{Context, Result, SetupError};
use crate::protocol::{IMAGE_IDS, SetupSpec};

/// One line of an id map: `count` ids from `inside` map to `outside`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// The uid and gid maps of a user namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IdMaps {
    pub uid: Vec<Extent>,
    pub gid: Vec<Extent>,
}

impl IdMaps {
    /// One uid and one gid: `inside` is `outside` on the host.
    pub fn single(uid: (u32, u32), gid: (u32, u32)) -> IdMaps {
        let one = |(inside, outside)| {
            vec![Extent {
                inside,
                outside,
                count: 1,
            }]
        };
        IdMaps {
            uid: one(uid),
            gid: one(gid),
        }
    }

    /// An image root's ids for root: 0 to 65535 inside are `base` onwards.
    pub fn allocated(base: u32) -> IdMaps {
        let all = vec![Extent {
            inside: 0,
            outside: base,
            count: IMAGE_IDS,
        }];
        IdMaps {
            uid: all.clone(),
            gid: all,
        }
    }

    /// How root's image sandbox sees its workspace and binds through an
    /// idmapped mount: the caller's files (uid and gid 0 on disk) as its
    /// default user's (`uid`, `gid`: the image's `User`, root unless it
    /// names another), so that user may write its workspace and what it
    /// writes is the caller's on the host; the ids 0 to 65535 it gives
    /// files otherwise as its own host ids, so that a `chown 1000` in the
    /// workspace hands nothing to the host's user 1000. (A file on disk is
    /// read as an id inside this map.)
    pub fn workspace(base: u32, uid: u32, gid: u32) -> IdMaps {
        IdMaps {
            uid: Self::swapped(base, uid),
            gid: Self::swapped(base, gid),
        }
    }

    /// The identity over `base`'s range, but for disk id 0, which is
    /// `user` inside, and what `user`'s place on disk would be, which is
    /// root's inside.
    fn swapped(base: u32, user: u32) -> Vec<Extent> {
        let user = user.min(IMAGE_IDS - 1);
        let one = |inside, outside| Extent {
            inside,
            outside,
            count: 1,
        };
        let same = |from: u32, to: u32| Extent {
            inside: base + from,
            outside: base + from,
            count: to - from,
        };
        if user == 0 {
            return vec![one(0, base), same(1, IMAGE_IDS)];
        }
        [
            one(0, base + user),
            one(base + user, base),
            same(1, user),
            same(user + 1, IMAGE_IDS),
        ]
        .into_iter()
        .filter(|e| e.count > 0)
        .collect()
    }

    /// The caller's ids, as the spec maps them.
    pub fn of(spec: &SetupSpec) -> IdMaps {
        IdMaps::single(
            (spec.inner_uid, spec.outer_uid),
            (spec.inner_gid, spec.outer_gid),
        )
    }

    fn text(extents: &[Extent]) -> String {
        extents
            .iter()
            .map(|e| format!("{} {} {}\n", e.inside, e.outside, e.count))
            .collect()
    }
}

/// Writes the id maps of the user namespace of the process whose `/proc`
/// directory is `proc` (`/proc/self`, or `/proc/PID` of a child namespace).
pub(crate) fn write_maps(proc: &str, ids: &IdMaps) -> Result<()> {
    MapWrites::new(proc, ids)
        .write()
        .map_err(|(what, e)| SetupError::new(what, e))
}

/// The writes of an id map, prepared ahead: the files' paths and contents
/// made, so that a helper sharing the supervisor's memory (see
/// `counts::with_light_helper`) can write them with system calls alone.
pub(crate) struct MapWrites {
    /// What each write does (for errors), its file, what it writes.
    files: [(&'static str, std::ffi::CString, Vec<u8>); 3],
}

impl MapWrites {
    pub fn new(proc: &str, ids: &IdMaps) -> MapWrites {
        let path = |file: &str| {
            std::ffi::CString::new(format!("{proc}/{file}")).expect("no NUL in a /proc path")
        };
        MapWrites {
            // setgroups first: it must precede gid_map for unprivileged callers.
            files: [
                ("deny setgroups", path("setgroups"), b"deny".to_vec()),
                (
                    "write uid_map",
                    path("uid_map"),
                    IdMaps::text(&ids.uid).into_bytes(),
                ),
                (
                    "write gid_map",
                    path("gid_map"),
                    IdMaps::text(&ids.gid).into_bytes(),
                ),
            ],
        }
    }

    /// Writes the maps with no allocation and nothing that sets `errno`;
    /// a failure says which write failed.
    pub fn write(&self) -> std::result::Result<(), (&'static str, rustix::io::Errno)> {
        use rustix::fs::{Mode, OFlags};
        for (what, path, text) in &self.files {
            let fail = |e| (*what, e);
            let fd = rustix::fs::open(
                path.as_c_str(),
                OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(fail)?;
            let written = rustix::io::write(&fd, text);
            // SAFETY: closing the descriptor just opened, by system call
            // (an OwnedFd's drop goes through the C library).
            unsafe { rustix::io::close(std::os::fd::IntoRawFd::into_raw_fd(fd)) };
            if written.map_err(fail)? != text.len() {
                return Err(fail(rustix::io::Errno::IO));
            }
        }
        Ok(())
    }
}

/// Writes the uid/gid maps of the user namespace this process just entered.
pub fn write_id_maps(spec: &SetupSpec) -> Result<()> {
    write_maps("/proc/self", &IdMaps::of(spec))
}

/// The setuid helpers that map subordinate ids (Debian's `uidmap`).
const NEWUIDMAP: &str = "/usr/bin/newuidmap";
const NEWGIDMAP: &str = "/usr/bin/newgidmap";

/// Enters the sandbox's namespaces as an unprivileged caller with a range
/// of subordinate ids: 0 inside is the caller, 1 onwards its `/etc/subuid`
/// and `/etc/subgid` ranges. A helper left in the host's namespace runs
/// `newuidmap` and `newgidmap` on this process once it has unshared: a
/// process cannot map its own namespace beyond its one id.
pub fn unshare_subordinate(
    flags: UnshareFlags,
    spec: &SetupSpec,
    sub: (u32, u32, u32),
) -> Result<()> {
    let (sub_uid, sub_gid, count) = sub;
    let count = count.min(IMAGE_IDS - 1);
    let parent = rustix::process::getpid().as_raw_nonzero().get();
    let map = |tool: &str, own: u32, sub: u32| -> std::result::Result<(), String> {
        let args = [
            parent.to_string(),
            "0".into(),
            own.to_string(),
            "1".into(),
            "1".into(),
            sub.to_string(),
            count.to_string(),
        ];
        let out = std::process::Command::new(tool)
            .args(&args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("run {tool}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        // The tool's own words (which range it refused), bounded: it is
        // the host's program reading the host's files.
        let said = String::from_utf8_lossy(&out.stderr);
        let said: String = said.trim().chars().take(300).collect();
        Err(format!("{tool} failed: {said}"))
    };
    super::counts::with_helper(
        "fork the id mapper",
        |mut go, mut done| {
            let mut b = [0u8];
            let result = match go.read(&mut b) {
                Ok(1) => map(NEWUIDMAP, spec.outer_uid, sub_uid)
                    .and_then(|()| map(NEWGIDMAP, spec.outer_gid, sub_gid)),
                _ => Err("the supervisor gave up before unsharing".into()),
            };
            let reply = match result {
                Ok(()) => String::new(),
                Err(e) => e,
            };
            let _ = done.write_all(reply.as_bytes());
        },
        |mut go, mut done, _| {
            // SAFETY: single-threaded; the caller forks before relying on
            // the new pid namespace.
            unsafe { rustix::thread::unshare_unsafe(flags) }
                .map_err(|e| SetupError::new("unshare the sandbox's namespaces", e))?;
            go.write_all(&[1])
                .map_err(|e| SetupError::io("start the id mapper", e))?;
            drop(go);
            let mut reply = String::new();
            let _ = done.read_to_string(&mut reply);
            if !reply.is_empty() {
                return Err(SetupError {
                    what: format!("map the subordinate ids: {reply}"),
                    errno: 0,
                });
            }
            Ok(())
        },
    )
}

/// Root's image sandboxes take their ranges of [`IMAGE_IDS`] host ids
/// from here up: above every account's, container manager's and systemd's
/// ranges, below the single owner uids of host-root sandboxes
/// (`native::OWNER_UID_BASE`).
const RANGES_BASE: u32 = 0x8000_0000;
/// How many ranges fit below `OWNER_UID_BASE`.
const RANGES: u32 = 0x3000_0000 / IMAGE_IDS;
/// Where a supervisor holds the lock on its range: a file per range,
/// locked for as long as any of the sandbox's supervisors lives.
const RANGE_LOCKS: &str = "/run/cordon/id-ranges";

/// A range of host ids no other live sandbox has: its first id, and the
/// open lock file that keeps it this sandbox's (dropped with the process).
pub fn allocate_range() -> Result<(u32, std::os::fd::OwnedFd)> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    fs::create_dir_all(RANGE_LOCKS).ctx(|| format!("create {RANGE_LOCKS}"))?;
    let dir = rustix::fs::open(
        RANGE_LOCKS,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .ctx(|| format!("open {RANGE_LOCKS}"))?;
    // Root's alone: nobody else may take or hold a range.
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700)).ctx(|| format!("chmod {RANGE_LOCKS}"))?;
    let start = rustix::process::getpid().as_raw_nonzero().get() as u32 % RANGES;
    for i in 0..RANGES {
        let slot = (start + i) % RANGES;
        let fd = rustix::fs::openat(
            &dir,
            slot.to_string(),
            OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .ctx(|| format!("open {RANGE_LOCKS}/{slot}"))?;
        if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Ok((RANGES_BASE + slot * IMAGE_IDS, fd));
        }
    }
    Err(SetupError {
        what: format!("every one of the {RANGES} id ranges for image sandboxes is in use"),
        errno: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_written_to_their_three_files() {
        let dir = tempfile::tempdir().unwrap();
        let files = ["setgroups", "uid_map", "gid_map"];
        for f in files {
            fs::write(dir.path().join(f), "").unwrap();
        }
        let ids = IdMaps::single((0, 4000), (0, 5000));
        MapWrites::new(dir.path().to_str().unwrap(), &ids)
            .write()
            .unwrap();
        let read = |f: &str| fs::read_to_string(dir.path().join(f)).unwrap();
        assert_eq!(read("setgroups"), "deny");
        assert_eq!(read("uid_map"), "0 4000 1\n");
        assert_eq!(read("gid_map"), "0 5000 1\n");
        // It creates nothing: a missing file is an error, as in /proc.
        fs::remove_file(dir.path().join("gid_map")).unwrap();
        assert_eq!(
            MapWrites::new(dir.path().to_str().unwrap(), &ids).write(),
            Err(("write gid_map", rustix::io::Errno::NOENT))
        );
    }

    #[test]
    fn a_light_helper_talks_over_its_pipes_and_is_reaped() {
        let (pid, got) = super::super::counts::with_light_helper(
            "test helper",
            |rx, tx| {
                let mut b = [0u8];
                if rustix::io::read(rx, &mut b) == Ok(1) {
                    let _ = rustix::io::write(tx, &[b[0] + 1]);
                }
            },
            |mut tx, mut rx, pid| {
                use std::io::{Read, Write};
                tx.write_all(&[40]).unwrap();
                let mut b = [0u8];
                rx.read_exact(&mut b).unwrap();
                Ok((pid, b[0]))
            },
        )
        .unwrap();
        assert_eq!(got, 41);
        // Reaped: no such child is left.
        // SAFETY: asking about a pid this test made.
        let rc = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(rc, -1, "the helper was not reaped");
    }

    #[test]
    fn maps_are_written_one_extent_per_line() {
        let ids = IdMaps::allocated(RANGES_BASE);
        assert_eq!(IdMaps::text(&ids.uid), "0 2147483648 65536\n");
        let one = IdMaps::single((0, 1000), (0, 100));
        assert_eq!(IdMaps::text(&one.uid), "0 1000 1\n");
        assert_eq!(IdMaps::text(&one.gid), "0 100 1\n");
    }

    #[test]
    fn the_workspace_is_the_default_users() {
        let b = RANGES_BASE;
        let root = IdMaps::workspace(b, 0, 0);
        assert_eq!(
            IdMaps::text(&root.uid),
            format!("0 {b} 1\n{} {} 65535\n", b + 1, b + 1)
        );
        let app = IdMaps::workspace(b, 1000, 1000);
        assert_eq!(
            IdMaps::text(&app.gid),
            format!(
                "0 {} 1\n{} {b} 1\n{} {} 999\n{} {} 64535\n",
                b + 1000,
                b + 1000,
                b + 1,
                b + 1,
                b + 1001,
                b + 1001
            )
        );
        // Every inside id once, every disk id once.
        for user in [0, 1, 1000, 65534, 65535] {
            let e = IdMaps::swapped(b, user);
            let mut disk: Vec<(u32, u32)> = e.iter().map(|e| (e.inside, e.count)).collect();
            let mut inside: Vec<(u32, u32)> = e.iter().map(|e| (e.outside, e.count)).collect();
            for v in [&mut disk, &mut inside] {
                v.sort();
                assert_eq!(v.iter().map(|(_, c)| c).sum::<u32>(), IMAGE_IDS, "{user}");
                for w in v.windows(2) {
                    assert!(w[0].0 + w[0].1 <= w[1].0, "{user}: {e:?}");
                }
            }
        }
    }

    #[test]
    fn ranges_stay_below_the_owner_uids() {
        let last = RANGES_BASE as u64 + RANGES as u64 * IMAGE_IDS as u64;
        assert!(last <= 0xB000_0000);
    }
}
