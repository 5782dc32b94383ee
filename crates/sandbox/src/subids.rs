//! An unprivileged caller's subordinate ids (`/etc/subuid`, `/etc/subgid`):
//! what an image sandbox's ids 1 to 65535 are on the host, mapped by the
//! setuid `newuidmap` and `newgidmap` (see `supervisor::ids`). Both files
//! are the host administrator's, read as the host's configuration.

use crate::error::{Error, Result};
use crate::protocol::{IMAGE_IDS, IdSource};

const SUBUID: &str = "/etc/subuid";
const SUBGID: &str = "/etc/subgid";
const NEWUIDMAP: &str = "/usr/bin/newuidmap";

/// The subordinate ids of the user `uid` (group `gid`), or an error that
/// says what the administrator must add.
pub(crate) fn subordinate(uid: u32) -> Result<IdSource> {
    let name = user_name(uid);
    let find = |file: &str| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        range_of(&text, name.as_deref(), uid)
    };
    let shown = name.clone().unwrap_or_else(|| uid.to_string());
    let (Some((sub_uid, uids)), Some((sub_gid, gids))) = (find(SUBUID), find(SUBGID)) else {
        return Err(Error::Config(format!(
            "an image runs with several users inside (its packages own files as them), \
             which needs a range of subordinate ids for {shown} (uid {uid}) in {SUBUID} and \
             {SUBGID}; as root, add one with `usermod --add-subuids 100000-165535 \
             --add-subgids 100000-165535 {shown}` (any free range of 65536 will do), or run \
             cordon as root"
        )));
    };
    if !std::path::Path::new(NEWUIDMAP).exists() {
        return Err(Error::Config(format!(
            "an image needs {NEWUIDMAP} and newgidmap to map {shown}'s subordinate ids: \
             install Debian's uidmap package"
        )));
    }
    Ok(IdSource::Subordinate {
        uid: sub_uid,
        gid: sub_gid,
        count: uids.min(gids).min(IMAGE_IDS - 1),
    })
}

/// The first range in a subordinate id file's `text` for the user `name`
/// or `uid`: (first id, how many).
fn range_of(text: &str, name: Option<&str>, uid: u32) -> Option<(u32, u32)> {
    let uid = uid.to_string();
    text.lines().find_map(|line| {
        let mut f = line.trim().splitn(3, ':');
        let (owner, start, count) = (f.next()?, f.next()?, f.next()?);
        if owner != uid && Some(owner) != name {
            return None;
        }
        let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
        (count > 0).then_some((start, count))
    })
}

/// The login name of `uid`, from the host's user database.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getpwuid_r writes into `pwd` and `buf`, whose sizes we pass;
    // the name it points to lives in `buf`, read before `buf` goes.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut out = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        if rc != 0 || out.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(pwd.pw_name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_found_by_name_or_uid() {
        let text = "alice:100000:65536\n1001:300000:1000\nbad line\nbob:x:5\n";
        assert_eq!(range_of(text, Some("alice"), 1000), Some((100000, 65536)));
        assert_eq!(range_of(text, Some("carol"), 1001), Some((300000, 1000)));
        assert_eq!(range_of(text, Some("bob"), 1002), None);
        assert_eq!(range_of(text, None, 1003), None);
    }
}
