//! Images a user gives the model with a message (`cordon exec --attach`,
//! `/attach` in the terminal UI): read on the host, checked to be an image
//! the APIs take, and sized within their limit.
//!
//! A path inside the workspace is the sandbox's to write: it is opened
//! beneath the workspace, so a link planted there cannot make cordon read
//! (and send to the model) a host file outside it. A path elsewhere is the
//! user's own, opened as they typed it.

use std::io::Read;
use std::path::Path;

use base64::Engine;

use crate::Image;
use crate::workspace::{Workspace, WsPath};

/// The largest image the APIs take (Anthropic's limit, per image).
pub const MAX_BYTES: u64 = 5 * 1024 * 1024;

/// Why a file cannot be attached, for the user.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("{path}: {why}")]
    Read { path: String, why: String },
    #[error(
        "{path} is {size} bytes; images up to {MAX_BYTES} bytes (5 MiB) can be attached: shrink it first"
    )]
    TooLarge { path: String, size: u64 },
    #[error("{path} is not a PNG, JPEG, GIF or WebP image")]
    NotAnImage { path: String },
}

/// The image at `path` (relative to `cwd`), read as described in the
/// module's doc; `workspace` is the host directory the sandbox writes.
pub fn read(path: &Path, cwd: &Path, workspace: &Path) -> Result<Image, AttachError> {
    let shown = path.display().to_string();
    let err = |why: String| AttachError::Read {
        path: shown.clone(),
        why,
    };
    let absolute = cwd.join(path);
    let (file, size) = match crate::workspace::beneath(workspace, &absolute) {
        Some(inside) => {
            let ws = Workspace::open(workspace).map_err(|e| err(e.to_string()))?;
            let rel = WsPath::parse(&inside.to_string_lossy()).map_err(|e| err(e.to_string()))?;
            ws.open_read(&rel).map_err(|e| err(e.to_string()))?
        }
        None => {
            let f = std::fs::File::open(&absolute).map_err(|e| err(e.to_string()))?;
            let meta = f.metadata().map_err(|e| err(e.to_string()))?;
            if !meta.is_file() {
                return Err(err("not a file".into()));
            }
            (f, meta.len())
        }
    };
    if size > MAX_BYTES {
        return Err(AttachError::TooLarge { path: shown, size });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(e.to_string()))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(AttachError::TooLarge {
            path: shown,
            size: bytes.len() as u64,
        });
    }
    let media_type = media_type(&bytes).ok_or(AttachError::NotAnImage { path: shown })?;
    Ok(Image {
        media_type: media_type.to_string(),
        data: base64::engine::general_purpose::STANDARD.encode(&bytes),
    })
}

/// The image type `bytes` start like, of those the APIs take.
pub fn media_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    #[test]
    fn images_are_read_and_typed_and_others_refused() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("shot.png"), PNG).unwrap();
        std::fs::write(ws.path().join("notes.txt"), "hello").unwrap();
        let img = read(Path::new("shot.png"), ws.path(), ws.path()).unwrap();
        assert_eq!(img.media_type, "image/png");
        let err = read(Path::new("notes.txt"), ws.path(), ws.path()).unwrap_err();
        assert!(
            err.to_string().contains("not a PNG, JPEG, GIF or WebP"),
            "{err}"
        );
        let big = ws.path().join("big.png");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        assert!(matches!(
            read(&big, ws.path(), ws.path()),
            Err(AttachError::TooLarge { .. })
        ));
        assert!(read(Path::new("missing.png"), ws.path(), ws.path()).is_err());
    }

    /// The attack: the sandbox plants `shot.png` as a link to a host image
    /// outside the workspace; attaching it must not read that file.
    #[test]
    fn a_link_in_the_workspace_is_not_followed_out_of_it() {
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("private.png");
        std::fs::write(&secret, PNG).unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&secret, ws.path().join("shot.png")).unwrap();
        let err = read(Path::new("shot.png"), ws.path(), ws.path()).unwrap_err();
        assert!(matches!(err, AttachError::Read { .. }), "{err}");
        // Named by its own path, the user's file outside is theirs to give.
        assert!(read(&secret, ws.path(), ws.path()).is_ok());
        // A path that walks out of the workspace and back in by name is
        // still inside, and still refused.
        let sneaky = ws.path().join("sub/../shot.png");
        assert!(read(&sneaky, host.path(), ws.path()).is_err());
    }
}
