//! The stat cache: what the last snapshot saw of each file (size, times,
//! inode, mode, blob id), so that an unchanged file is neither opened nor
//! sent again, as git's index spares it. Kept in cordon's own repository,
//! never in the workspace.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha1::Digest;

use super::SnapshotError;
use super::read::FileStat;

/// Bumped when [`Cache`] changes: an old cache is then read as empty. It
/// is postcard (not self-describing): no field may be skipped or defaulted.
const VERSION: u32 = 4;

/// The cache's record of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Stat {
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    pub ino: u64,
    pub mode: u32,
    pub oid: String,
    /// Changed too recently to trust its times: read again next time.
    pub racy: bool,
}

impl Stat {
    /// Whether `st`, seen with `mode`, is the file this records, unread.
    pub fn vouches_for(&self, st: &FileStat, mode: u32) -> bool {
        !self.racy
            && self.size == st.size
            && self.mtime == st.mtime
            && self.ctime == st.ctime
            && self.ino == st.ino
            && self.mode == mode
            && !self.oid.is_empty()
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Cache {
    version: u32,
    /// The commit whose tree `files` lists whole: a snapshot whose parent
    /// is this commit sends fast-import only what changed.
    pub commit: Option<String>,
    /// Every file of that tree. Keys are the paths as text; a name that is
    /// not UTF-8 is stored lossily, so it never hits, and the whole
    /// listing is then sent instead (see `lossless`).
    pub files: HashMap<String, Stat>,
    /// Every key is a path exactly.
    pub lossless: bool,
}

impl Cache {
    /// An empty cache for the tree of `commit`, to fill.
    pub fn of(commit: String, capacity: usize) -> Cache {
        Cache {
            version: VERSION,
            commit: Some(commit),
            files: HashMap::with_capacity(capacity),
            lossless: true,
        }
    }

    /// Whether this lists the whole tree of `parent`.
    pub fn lists(&self, parent: Option<&str>) -> bool {
        self.lossless && parent.is_some() && self.commit.as_deref() == parent
    }

    /// The cache at `path`; empty if there is none or it is not this
    /// version's.
    pub fn load(path: &Path) -> Cache {
        let Ok(bytes) = std::fs::read(path) else {
            return Cache::default();
        };
        // The version first, on its own: any other layout reads as empty.
        match postcard::from_bytes::<u32>(&bytes) {
            Ok(VERSION) => {}
            _ => return Cache::default(),
        }
        match postcard::from_bytes::<Cache>(&bytes) {
            Ok(c) if c.version == VERSION => c,
            _ => Cache::default(),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), SnapshotError> {
        let tmp = path.with_extension("tmp");
        let bytes = postcard::to_stdvec(self).expect("a cache of strings and numbers serializes");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(SnapshotError::State)
    }
}

/// The id git gives `content` as a blob in a SHA-1 repository (cordon's
/// own checkpoints are one): known before git sees the bytes, so content
/// the parent already holds is never sent again.
pub(super) fn blob_oid(content: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_ids_are_gits() {
        // `printf 'hello\n' | git hash-object --stdin`, and the empty blob.
        assert_eq!(
            blob_oid(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(blob_oid(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    }
}
