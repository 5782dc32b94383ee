//! The files API over one workspace, a job's or a session's: list a
//! directory, read a file, write one. Every path goes through
//! [`Workspace`], which the kernel keeps beneath the workspace
//! (`openat2` with `RESOLVE_BENEATH`): the workspace is the sandbox's, and
//! a link or `..` in it leads nowhere else.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use cordon_tools::{Workspace, WorkspaceError, WsPath};
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};

use crate::archive::{Archive, ArchiveError, Kind, Tree};
use crate::http::{ApiError, ApiResult};

/// A directory of a workspace.
#[derive(Debug, Serialize, ToSchema)]
pub struct Listing {
    /// Relative to the workspace.
    pub path: String,
    /// Sorted by name.
    pub entries: Vec<Entry>,
    /// The directory holds more than the API lists at once
    /// ([`MAX_LISTED`]): `entries` are some of them.
    pub truncated: bool,
}

/// Entries one listing reads at most: a sandbox can make a directory of
/// millions, and a request must cost a bounded amount.
pub const MAX_LISTED: usize = 10_000;

/// One name in a directory: data, shown as a JSON string, never followed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Entry {
    pub name: String,
    pub r#type: EntryType,
    /// A file's size in bytes.
    pub size: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    File,
    Directory,
    Symlink,
    Other,
}

/// What a write did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Written {
    pub path: String,
    /// False when an existing file was replaced.
    pub created: bool,
}

/// A workspace error as the API answers it.
pub(crate) fn error(e: WorkspaceError) -> ApiError {
    match e {
        WorkspaceError::NotFound { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
        }
        WorkspaceError::Io { .. } | WorkspaceError::Root { .. } => {
            tracing::error!("files: {e}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "cannot read the workspace",
            )
        }
        _ => ApiError::bad_request(e.to_string()),
    }
}

/// A directory's entries, sorted by name: each one's name, type and (for
/// a file) size. Names are data, shown as JSON strings, never followed.
pub(crate) fn list(ws: &Workspace, path: &str) -> ApiResult<Listing> {
    let path = WsPath::parse(path).map_err(error)?;
    listing(ws, &path)
}

fn listing(ws: &Workspace, path: &WsPath) -> ApiResult<Listing> {
    let (_fd, dir) = ws.open_dir(path).map_err(error)?;
    let mut entries: Vec<Entry> = std::fs::read_dir(&dir)
        .map_err(|e| {
            error(WorkspaceError::Io {
                path: path.display(),
                source: e,
            })
        })?
        .flatten()
        .take(MAX_LISTED + 1)
        .map(|e| {
            let meta = e.metadata().ok();
            let kind = match meta.as_ref().map(|m| m.file_type()) {
                Some(t) if t.is_dir() => EntryType::Directory,
                Some(t) if t.is_file() => EntryType::File,
                Some(t) if t.is_symlink() => EntryType::Symlink,
                _ => EntryType::Other,
            };
            Entry {
                name: e.file_name().to_string_lossy().into_owned(),
                r#type: kind,
                size: meta.filter(|m| m.is_file()).map(|m| m.len()),
            }
        })
        .collect();
    let truncated = entries.len() > MAX_LISTED;
    entries.truncate(MAX_LISTED);
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Listing {
        path: path.display().to_string(),
        entries,
        truncated,
    })
}

/// A file's bytes (at most `limit`), or a directory's listing as JSON.
pub(crate) fn read(ws: &Workspace, path: &str, limit: usize) -> ApiResult<Response> {
    let p = WsPath::parse(path).map_err(error)?;
    match ws.open_read(&p) {
        Ok((file, size)) => {
            too_large(path, size, limit)?;
            let file = tokio::fs::File::from_std(file);
            Ok(file_answer(path, size, Body::from_stream(chunks(file))))
        }
        Err(WorkspaceError::IsDirectory { .. }) => Ok(Json(listing(ws, &p)?).into_response()),
        Err(e) => Err(error(e)),
    }
}

/// As [`read`], from job `id`'s archive: the index resolves the path (its
/// links within the workspace only), and a file is one ranged read.
pub(crate) async fn read_archived(
    archive: &Archive,
    id: &str,
    path: &str,
    limit: usize,
) -> ApiResult<Response> {
    let p = WsPath::parse(path).map_err(error)?;
    let tree = archive.index(id).await.map_err(unavailable)?;
    let found = tree.resolve(&p).map_err(error)?;
    match *found.kind {
        Kind::File { size, offset } => {
            too_large(path, size, limit)?;
            let bytes = archive
                .range(id, offset..offset + size)
                .await
                .map_err(unavailable)?;
            let body = Body::from_stream(bytes.map(|b| b.map_err(std::io::Error::other)));
            Ok(file_answer(path, size, body))
        }
        _ => Ok(Json(archived_listing(&tree, &found.path, &p)).into_response()),
    }
}

/// A directory of job `id`'s archive.
pub(crate) async fn list_archived(archive: &Archive, id: &str, path: &str) -> ApiResult<Listing> {
    let p = WsPath::parse(path).map_err(error)?;
    let tree = archive.index(id).await.map_err(unavailable)?;
    let found = tree.resolve(&p).map_err(error)?;
    match found.kind {
        Kind::Directory => Ok(archived_listing(&tree, &found.path, &p)),
        _ => Err(error(WorkspaceError::NotDirectory { path: p.display() })),
    }
}

fn archived_listing(tree: &Tree, dir: &str, shown: &WsPath) -> Listing {
    let mut children = tree.children(dir);
    Listing {
        path: shown.display(),
        entries: children
            .by_ref()
            .take(MAX_LISTED)
            .map(|(name, kind)| Entry {
                name: name.to_string(),
                r#type: match kind {
                    Kind::File { .. } => EntryType::File,
                    Kind::Directory => EntryType::Directory,
                    Kind::Symlink { .. } => EntryType::Symlink,
                },
                size: match kind {
                    Kind::File { size, .. } => Some(*size),
                    _ => None,
                },
            })
            .collect(),
        truncated: children.next().is_some(),
    }
}

/// The archive failed: logged here, a retry asked of the client.
fn unavailable(e: ArchiveError) -> ApiError {
    tracing::error!("files: {e}");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "cannot read the archive; try again",
    )
}

fn too_large(path: &str, size: u64, limit: usize) -> ApiResult<()> {
    if size > limit as u64 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("{path} is {size} bytes; the files API serves at most {limit}"),
        ));
    }
    Ok(())
}

/// A workspace file's bytes as the API answers them.
fn file_answer(path: &str, size: u64, body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type(path).to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
            // The bytes are the sandbox's: never let a browser guess them
            // into something that runs, and an SVG or a file opened on its
            // own runs nothing either.
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (header::CONTENT_SECURITY_POLICY, FILE_CSP.to_string()),
        ],
        body,
    )
        .into_response()
}

/// What a workspace file may be shown as: no script, no style from
/// elsewhere, no framing; a document opened directly is sandboxed.
const FILE_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; sandbox";

/// A file's bytes, as they are: in the OpenAPI document, a binary string.
pub struct FileBytes;

impl utoipa::PartialSchema for FileBytes {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}
impl ToSchema for FileBytes {}

/// What reading a workspace path answers, for the OpenAPI document: one
/// content type per kind [`content_type`] gives, and a directory's listing.
#[derive(utoipa::ToResponse)]
#[response(
    description = "A directory's listing (JSON), or the file's bytes typed by its name: images as themselves, UTF-8 text as text/plain, anything else as application/octet-stream"
)]
#[allow(dead_code)] // Only its schema is used.
pub enum FileAnswer {
    Listing(#[content("application/json")] Listing),
    Bytes(#[content("application/octet-stream")] FileBytes),
    Text(#[content("text/plain")] String),
    Png(#[content("image/png")] FileBytes),
    Jpeg(#[content("image/jpeg")] FileBytes),
    Gif(#[content("image/gif")] FileBytes),
    Webp(#[content("image/webp")] FileBytes),
    Svg(#[content("image/svg+xml")] FileBytes),
}

/// The type a file is served as, by its name's extension: images a
/// browser shows as images, text as plain UTF-8 text (HTML too: never a
/// page of this origin), anything else as bytes to download.
fn content_type(path: &str) -> &'static str {
    let ext = path
        .rsplit('/')
        .next()
        .and_then(|name| name.rsplit_once('.'))
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "txt" | "md" | "log" | "csv" | "tsv" | "json" | "jsonl" | "toml" | "yaml" | "yml"
        | "ini" | "cfg" | "py" | "js" | "mjs" | "ts" | "rs" | "go" | "c" | "h" | "cpp" | "java"
        | "rb" | "sh" | "html" | "htm" | "css" | "xml" | "sql" | "diff" | "patch" => {
            "text/plain; charset=utf-8"
        }
        _ => "application/octet-stream",
    }
}

/// Writes `body` to `path` (parents created): 201 if it is new, else 200.
pub(crate) async fn write(ws: Workspace, path: String, body: Bytes) -> ApiResult<Response> {
    let p = WsPath::parse(&path).map_err(error)?;
    let created = tokio::task::spawn_blocking(move || ws.write(&p, &body))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the write failed",
            )
        })?
        .map_err(error)?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(Written { path, created })).into_response())
}

/// Reads a file in chunks without a dependency on tokio-util.
fn chunks(file: tokio::fs::File) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    use tokio::io::AsyncReadExt;
    futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// Readies the workspaces' volumes under `data` as the server starts:
/// says whether new workspaces get one, unmounts what an earlier run left
/// mounted (each is mounted again when next used), and removes what MCP
/// sessions of an earlier run left.
pub(crate) fn ready_volumes(data: &std::path::Path) {
    if cordon_sandbox::volume::supported() {
        tracing::info!("workspaces are file systems of their own: disk budgets bound everything");
    } else {
        tracing::warn!(
            "workspaces are plain directories: the disk budget is a watcher's, which a file \
             held only by a descriptor in flight escapes (run as root, with mkfs.ext4, for volumes)"
        );
    }
    for kind in ["jobs", "sessions"] {
        if let Err(e) = cordon_sandbox::volume::unmount_beneath(&data.join(kind)) {
            tracing::warn!("cannot unmount the {kind}' earlier volumes: {e}");
        }
    }
    // No MCP session outlives its process: the scratch workspaces of one
    // that ended uncleanly (their volumes with them) go.
    if let Err(e) = remove_tree(&data.join("mcp")) {
        tracing::warn!("cannot remove the MCP sessions' old workspaces: {e}");
    }
}

/// [`remove_tree`] off the async runtime, a failure logged as `what`'s.
pub(crate) async fn remove_files(dir: std::path::PathBuf, what: &str) {
    match tokio::task::spawn_blocking(move || remove_tree(&dir)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("cannot remove {what}'s files: {e}"),
        Err(e) => tracing::warn!("cannot remove {what}'s files: {e}"),
    }
}

/// Removes `dir` and everything in it, a workspace's volume too; one that
/// is already gone is fine.
pub(crate) fn remove_tree(dir: &std::path::Path) -> std::io::Result<()> {
    cordon_sandbox::volume::release(dir)?;
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    };
    match gone(std::fs::remove_dir_all(dir)) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            cordon_sandbox::make_removable(dir)?;
            gone(std::fs::remove_dir_all(dir))
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::content_type;

    #[test]
    fn files_are_typed_by_an_allowlist_and_html_is_text() {
        assert_eq!(content_type("screenshots/step-01.png"), "image/png");
        assert_eq!(content_type("a/b.JPG"), "image/jpeg");
        assert_eq!(content_type("plot.svg"), "image/svg+xml");
        assert_eq!(content_type("index.html"), "text/plain; charset=utf-8");
        assert_eq!(content_type("app.py"), "text/plain; charset=utf-8");
        assert_eq!(content_type("Makefile"), "application/octet-stream");
        assert_eq!(content_type("x.exe"), "application/octet-stream");
        assert_eq!(content_type("dir.png/file"), "application/octet-stream");
    }
}
