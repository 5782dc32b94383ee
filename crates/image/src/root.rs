//! What a sandbox needs of a stored image: its layers top first, where its
//! writable layer goes, and the user, environment and directory its config
//! asks for.
//!
//! A user given by name is looked up in the image's own `/etc/passwd` and
//! `/etc/group`, read from the topmost layer that has them: files of the
//! image, so read beneath the layer's directory through no link, bounded,
//! and parsed as text that may be anything.

use std::io::Read;
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::store::{Image, Store, StoreError, invalid};

/// The most of `/etc/passwd` or `/etc/group` read.
const MAX_DB: u64 = 1 << 20;

/// A stored image as a sandbox's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRoot {
    /// The unpacked layers, the top layer first.
    pub layers: Vec<PathBuf>,
    /// Where sandboxes make their writable layers: in the store, on the
    /// layers' file system.
    pub scratch: PathBuf,
    /// Where microVMs' flat roots are made (see [`crate::flat`]).
    pub flat: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// The config's `Env`, as pairs (entries without `=` are dropped).
    pub env: Vec<(String, String)>,
    /// The image's manifest digest: what a commit of the sandbox's changes
    /// builds on.
    pub manifest: crate::Digest,
    /// The config's `WorkingDir`, when absolute.
    pub working_dir: Option<String>,
}

impl Store {
    /// `image` as a sandbox's root, running as `user` (`NAME`, `UID`,
    /// `NAME:GROUP`, `UID:GID`) or else the image's own `User` (root when
    /// it has none).
    pub fn sandbox_root(
        &self,
        image: &Image,
        user: Option<&str>,
    ) -> Result<SandboxRoot, StoreError> {
        let layers: Vec<PathBuf> = image
            .layers
            .iter()
            .rev()
            .map(|d| self.layer_dir(d))
            .collect();
        for l in &layers {
            if !l.is_dir() {
                return Err(invalid(format!(
                    "{}: a layer of this image is missing from the store; pull it again",
                    image.name
                )));
            }
        }
        let user = user.or(image.user.as_deref()).unwrap_or("").trim();
        let (uid, gid) = resolve_user(&layers, user)?;
        let env = image
            .env
            .iter()
            .filter_map(|e| {
                let (k, v) = e.split_once('=')?;
                (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
            })
            .collect();
        Ok(SandboxRoot {
            manifest: image.manifest,
            layers,
            scratch: self.root().join("run"),
            flat: self.flat_dir(),
            uid,
            gid,
            env,
            working_dir: image.working_dir.clone().filter(|w| w.starts_with('/')),
        })
    }
}

/// The ids of `user` (`NAME`, `UID`, `NAME:GROUP`, `UID:GID`; empty is
/// root) in the image whose layers are `layers` (top first).
pub fn resolve_user(layers: &[PathBuf], user: &str) -> Result<(u32, u32), StoreError> {
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = read_db(layers, "etc/passwd");
    // A number needs no entry; a name must have one.
    let entry = passwd
        .as_deref()
        .and_then(|text| find(text, |f| f[0] == u || f.get(2) == Some(&u)));
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => entry
            .as_ref()
            .and_then(|f| f.get(2)?.parse().ok())
            .ok_or_else(|| invalid(format!("the image has no user {u:?} in its /etc/passwd")))?,
    };
    let gid = match g {
        None => entry
            .as_ref()
            .and_then(|f| f.get(3)?.parse().ok())
            .unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => read_db(layers, "etc/group")
                .as_deref()
                .and_then(|text| find(text, |f| f[0] == g))
                .and_then(|f| f.get(2)?.parse().ok())
                .ok_or_else(|| {
                    invalid(format!("the image has no group {g:?} in its /etc/group"))
                })?,
        },
    };
    Ok((uid, gid))
}

/// A user of an image, as its `/etc/passwd` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Absolute; `/` when the entry gives none or a relative one.
    pub home: String,
}

impl Account {
    /// Root, whatever the image says.
    pub fn root() -> Account {
        Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        }
    }

    /// From a passwd entry's fields; the file is the image's, so only a
    /// name and an absolute path of printable characters are taken.
    fn of(f: &[String]) -> Option<Account> {
        let printable =
            |s: &str| !s.is_empty() && s.len() <= 256 && s.chars().all(|c| c.is_ascii_graphic());
        let uid = f.get(2)?.parse().ok()?;
        let gid = f.get(3).and_then(|g| g.parse().ok()).unwrap_or(uid);
        if !printable(&f[0]) {
            return None;
        }
        let home = f.get(5).cloned().unwrap_or_default();
        let home =
            if home.starts_with('/') && printable(&home) && !home.split('/').any(|c| c == "..") {
                home
            } else if uid == 0 {
                "/root".into()
            } else {
                "/".into()
            };
        Some(Account {
            name: f[0].clone(),
            uid,
            gid,
            home,
        })
    }
}

/// Who `uid` (of group `gid`) is in the image whose layers are `layers`
/// (top first): its passwd entry's name and home, else the number as its
/// name and `/` as its home (`/root` for root).
pub fn account(layers: &[PathBuf], uid: u32, gid: u32) -> Account {
    let entry = read_db(layers, "etc/passwd").as_deref().and_then(|text| {
        find(text, |f| {
            f.get(2).and_then(|u| u.parse::<u32>().ok()) == Some(uid)
        })
    });
    match entry.as_deref().and_then(Account::of) {
        Some(a) => Account { gid, ..a },
        None if uid == 0 => Account {
            gid,
            ..Account::root()
        },
        None => Account {
            name: uid.to_string(),
            uid,
            gid,
            home: "/".into(),
        },
    }
}

/// The user named `name` in the image whose layers are `layers`, if it
/// has one (root always).
pub fn account_named(layers: &[PathBuf], name: &str) -> Option<Account> {
    let entry = read_db(layers, "etc/passwd")
        .as_deref()
        .and_then(|text| find(text, |f| f[0] == name))
        .and_then(|f| Account::of(&f));
    match entry {
        None if name == "root" => Some(Account::root()),
        found => found,
    }
}

/// The names an image gives its user and group ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    pub users: std::collections::HashMap<u32, String>,
    pub groups: std::collections::HashMap<u32, String>,
}

impl Names {
    /// `uid`'s name, else the number.
    pub fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    /// `gid`'s name, else the number.
    pub fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// The user and group names of the image whose layers are `layers`: the
/// first of each id, printable names only (the files are the image's).
pub fn names(layers: &[PathBuf]) -> Names {
    let table = |rel: &str| {
        let mut out = std::collections::HashMap::new();
        for line in read_db(layers, rel).unwrap_or_default().lines() {
            let f: Vec<&str> = line.split(':').collect();
            let printable = |s: &str| {
                !s.is_empty() && s.len() <= 256 && s.chars().all(|c| c.is_ascii_graphic())
            };
            if let (Some(name), Some(Ok(id))) = (f.first(), f.get(2).map(|i| i.parse::<u32>()))
                && printable(name)
            {
                out.entry(id).or_insert_with(|| name.to_string());
            }
        }
        out
    };
    Names {
        users: table("etc/passwd"),
        groups: table("etc/group"),
    }
}

/// The fields of the first line of a colon-separated database `text` that
/// `matches`.
fn find(text: &str, matches: impl Fn(&[&str]) -> bool) -> Option<Vec<String>> {
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && matches(f))
        .map(|f| f.into_iter().map(str::to_string).collect())
}

/// The file `rel` of the image: from the topmost layer that has it as a
/// plain file; `None` when a layer above deleted it (a whiteout, or an
/// opaque directory above it) or none has it.
fn read_db(layers: &[PathBuf], rel: &str) -> Option<String> {
    let (dir, _) = rel.rsplit_once('/')?;
    for layer in layers {
        let root = rustix::fs::open(
            layer,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let beneath =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let found = rustix::fs::openat2(
            &root,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
            beneath,
        );
        match found {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd).ok()?;
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    != rustix::fs::FileType::RegularFile
                {
                    // A whiteout (a character device) or anything else.
                    return None;
                }
                let mut text = String::new();
                std::fs::File::from(fd)
                    .take(MAX_DB)
                    .read_to_string(&mut text)
                    .ok()?;
                return Some(text);
            }
            Err(rustix::io::Errno::NOENT) => {}
            Err(_) => return None,
        }
        // A directory made opaque in this layer hides the ones below.
        if let Ok(d) = rustix::fs::openat2(
            &root,
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            beneath,
        ) {
            let mut v = [0u8; 1];
            if rustix::fs::fgetxattr(&d, "user.overlay.opaque", &mut v).is_ok() && v[0] == b'y' {
                return None;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (path, body) in files {
            let p = d.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        d
    }

    #[test]
    fn accounts_come_from_the_top_passwd_and_distrust_it() {
        let l = layer(&[(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n\
             evil:x:1001:1001::../../etc:/bin/sh\nodd\u{1b}:x:1002:1::/x:/bin/sh\n",
        )]);
        let layers = [l.path().to_path_buf()];
        let a = |uid| account(&layers, uid, uid);
        let user = Account {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
        };
        assert_eq!(a(1000), user);
        assert_eq!(account_named(&layers, "user"), Some(user));
        assert_eq!(a(0), Account::root());
        assert_eq!(a(1001).home, "/");
        assert_eq!(a(1002).name, "1002");
        assert_eq!(a(4242).home, "/");
        assert_eq!(account(&[], 0, 0), Account::root());
        assert_eq!(account_named(&[], "root"), Some(Account::root()));
        assert_eq!(account_named(&layers, "nobody"), None);
        assert_eq!(account_named(&layers, "odd\u{1b}"), None);
        let n = names(&layers);
        assert_eq!(
            (n.user(1000), n.user(1002), n.user(7)),
            ("user".into(), "1002".into(), "7".into())
        );
        assert_eq!(n.group(0), "0");
    }

    #[test]
    fn users_resolve_by_name_number_and_group() {
        let top = layer(&[("etc/group", "root:x:0:\nstaff:x:50:\n")]);
        let base = layer(&[(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1001::/home/alice:/bin/sh\n",
        )]);
        let layers = vec![top.path().to_path_buf(), base.path().to_path_buf()];
        assert_eq!(resolve_user(&layers, "").unwrap(), (0, 0));
        assert_eq!(resolve_user(&layers, "alice").unwrap(), (1000, 1001));
        assert_eq!(resolve_user(&layers, "1000").unwrap(), (1000, 1001));
        assert_eq!(resolve_user(&layers, "4242").unwrap(), (4242, 0));
        assert_eq!(resolve_user(&layers, "alice:staff").unwrap(), (1000, 50));
        assert_eq!(resolve_user(&layers, "7:8").unwrap(), (7, 8));
        assert!(
            resolve_user(&layers, "bob")
                .unwrap_err()
                .to_string()
                .contains("no user")
        );
        assert!(resolve_user(&layers, "alice:wheel").is_err());
    }

    #[test]
    fn a_linked_passwd_is_not_followed() {
        let outside = layer(&[("passwd", "mallory:x:0:0::/:/bin/sh\n")]);
        let top = tempfile::tempdir().unwrap();
        std::fs::create_dir(top.path().join("etc")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("passwd"), top.path().join("etc/passwd"))
            .unwrap();
        let layers = vec![top.path().to_path_buf()];
        assert!(resolve_user(&layers, "mallory").is_err());
    }
}
