//! What a checkpoint's commit says of itself in its message.

use crate::command::{Git, GitError};

/// What a snapshot's commit says of itself besides its files, in its
/// message: the paths it left out (which a restore to it must not remove)
/// and whether its walk saw everything.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub skipped: Vec<Vec<u8>>,
    pub incomplete: bool,
}

const SKIPPED_TRAILER: &str = "Cordon-Skipped: ";
const INCOMPLETE_TRAILER: &str = "Cordon-Incomplete: true";

impl Meta {
    /// `label`, then the trailers (paths hex-encoded: any bytes, one line).
    pub(super) fn message(&self, label: &str) -> String {
        let mut m = label.replace('\n', " ");
        if !self.skipped.is_empty() || self.incomplete {
            m.push('\n');
        }
        for p in &self.skipped {
            m.push('\n');
            m.push_str(SKIPPED_TRAILER);
            for b in p {
                m.push_str(&format!("{b:02x}"));
            }
        }
        if self.incomplete {
            m.push('\n');
            m.push_str(INCOMPLETE_TRAILER);
        }
        m
    }

    /// Reads what [`Meta::message`] wrote.
    pub(crate) fn of(git: &Git, commit: &str) -> Result<Meta, GitError> {
        let out = git.run(["log", "-1", "--format=%B", commit])?;
        let mut meta = Meta::default();
        for line in String::from_utf8_lossy(&out).lines() {
            if let Some(hex) = line.strip_prefix(SKIPPED_TRAILER) {
                let bytes: Option<Vec<u8>> = (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        hex.get(i..i + 2)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                    })
                    .collect();
                if let Some(b) = bytes {
                    meta.skipped.push(b);
                }
            } else if line == INCOMPLETE_TRAILER {
                meta.incomplete = true;
            }
        }
        Ok(meta)
    }
}
