//! Finished jobs' workspaces and logs in an object store every process of
//! a deployment reads (`cordon serve --archive URL`).
//!
//! The process that ran a job packs its workspace, once the sandbox is
//! gone, into one uncompressed tar, `jobs/<id>/workspace.tar`, then writes
//! an index of it, `jobs/<id>/index.json` (each entry's path, type, size
//! and where its bytes start), and the agent's log,
//! `jobs/<id>/session.jsonl`. Any process then lists a directory from the
//! index and serves a file with one ranged GET. One object per workspace
//! keeps the store at one PUT per job (see docs/deploy.md); no compression
//! keeps each file one range, and the tar is what `tar x` reads.
//!
//! The workspace was the sandbox's. Packing opens every path beneath its
//! root (`openat2` with `RESOLVE_BENEATH`, through [`Workspace`]), keeps a
//! link as a link and never follows it, leaves out devices, pipes and
//! sockets, drops set-id bits and names no owner. Names are data: JSON
//! strings in the index, and a read follows links only within the index,
//! refusing any that lead out of it, as the files API does on disk.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use cordon_tools::{Workspace, WorkspaceError, WsPath};

mod images;

/// The index format this build writes and reads.
const INDEX_VERSION: u32 = 1;

/// Entries one archive takes at most; a workspace with more is archived
/// in part, and its index says so.
const MAX_ENTRIES: usize = 500_000;

/// Links a read follows at most before it calls the path a loop (as
/// Linux's own limit).
const MAX_LINKS: usize = 40;

/// Indexes kept parsed in memory (an archive never changes once written),
/// and the largest kept: a file read then costs one GET, not two.
const CACHED_INDEXES: usize = 32;
const CACHED_ENTRIES_MAX: usize = 50_000;

/// Files a queued job may have staged for it, and how long a path may be
/// (its key is the path in hex, within S3's 1,024 bytes).
const MAX_STAGED: usize = 1_000;
const MAX_STAGED_PATH: usize = 400;

/// The tar streams from the packing thread to the upload in chunks this
/// size, a few at a time.
const CHUNK: usize = 1 << 20;
const CHUNKS_IN_FLIGHT: usize = 4;

/// Where finished jobs are kept: `s3://BUCKET[/PREFIX]` (endpoint, region
/// and credentials from the `AWS_*` environment) or `file:///DIR` (a
/// volume every process mounts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveUrl(url::Url);

impl FromStr for ArchiveUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let url = url::Url::parse(s.trim()).map_err(|e| format!("{s:?} is not a URL: {e}"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "credentials do not go in the archive's URL: set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY in the environment"
                    .into(),
            );
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{url}: no query or fragment in the archive's URL"));
        }
        match url.scheme() {
            "s3" if url.host_str().is_some_and(|h| !h.is_empty()) => Ok(ArchiveUrl(url)),
            "s3" => Err(format!("{url}: name the bucket, s3://BUCKET[/PREFIX]")),
            "file" if url.host_str().is_none_or(str::is_empty) && url.path().len() > 1 => {
                Ok(ArchiveUrl(url))
            }
            "file" => Err(format!("{url}: give a directory, file:///DIR")),
            other => Err(format!(
                "{other}: the archive is s3://BUCKET[/PREFIX] or file:///DIR"
            )),
        }
    }
}

impl std::fmt::Display for ArchiveUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Why something about the archive failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive {url}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error(
        "cannot write to the archive {url} (tried at start; for s3:// the endpoint, region and \
         credentials come from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY, or a web identity or the instance's role): {source}"
    )]
    Probe {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("packing job {id}'s workspace: {source}")]
    Pack {
        id: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Staging(String),
    #[error("job {id}'s archived index: {why}")]
    Index { id: String, why: String },
}

/// The archive one process writes and reads.
pub struct Archive {
    url: ArchiveUrl,
    store: Arc<dyn ObjectStore>,
    /// Jobs this process is archiving now: a job finished and the backlog's
    /// sweep must not pack it twice at once.
    busy: Mutex<HashSet<String>>,
    /// Recently read indexes, newest last.
    cache: Mutex<VecDeque<(String, Arc<Tree>)>>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive").field("url", &self.url).finish()
    }
}

impl Archive {
    /// The store at `url`; nothing is asked of it yet ([`Archive::probe`]).
    pub fn open(url: &ArchiveUrl) -> Result<Archive, ArchiveError> {
        let err = |source| ArchiveError::Store {
            url: url.to_string(),
            source,
        };
        let prefix = url.0.path().trim_matches('/').to_string();
        let store: Arc<dyn ObjectStore> = match url.0.scheme() {
            "s3" => {
                let bucket = format!("s3://{}", url.0.host_str().unwrap_or_default());
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(bucket)
                    .build()
                    .map_err(err)?;
                if prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
                }
            }
            _ => {
                let dir = PathBuf::from(url.0.path());
                std::fs::create_dir_all(&dir).map_err(|e| {
                    err(object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source: Box::new(e),
                    })
                })?;
                Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(err)?)
            }
        };
        Ok(Archive {
            url: url.clone(),
            store,
            busy: Mutex::new(HashSet::new()),
            cache: Mutex::new(VecDeque::new()),
        })
    }

    pub fn url(&self) -> &ArchiveUrl {
        &self.url
    }

    fn err(&self, source: object_store::Error) -> ArchiveError {
        ArchiveError::Store {
            url: self.url.to_string(),
            source,
        }
    }

    /// Writes and removes an object, so that a server told of an archive it
    /// cannot use says so when it starts rather than when a job ends.
    pub async fn probe(&self, worker: &str) -> Result<(), ArchiveError> {
        let key = Key::from(format!("probes/{worker}"));
        let probe = |source| ArchiveError::Probe {
            url: self.url.to_string(),
            source,
        };
        self.store
            .put(&key, PutPayload::from_static(b"cordon"))
            .await
            .map_err(probe)?;
        self.store.delete(&key).await.map_err(probe)
    }

    /// Packs the workspace at `workspace` and uploads it with its index,
    /// then `log` if there is one. Answers false, doing nothing, when this
    /// process is archiving that job already.
    pub async fn keep(
        &self,
        id: &str,
        workspace: &Path,
        log: Option<&Path>,
    ) -> Result<bool, ArchiveError> {
        let Some(_busy) = Busy::take(&self.busy, id) else {
            return Ok(false);
        };
        let pack_err = |source| ArchiveError::Pack {
            id: id.to_string(),
            source,
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(CHUNKS_IN_FLIGHT);
        let root = workspace.to_path_buf();
        let packing = tokio::task::spawn_blocking(move || pack(&root, Chunks::new(tx)));
        let mut upload =
            object_store::buffered::BufWriter::new(self.store.clone(), key(id, "workspace.tar"));
        let mut sent = Ok(());
        while let Some(chunk) = rx.recv().await {
            if let Err(e) = upload.write_all(&chunk).await {
                sent = Err(e);
                // Closing the channel stops the packer at its next chunk.
                break;
            }
        }
        drop(rx);
        let packed = packing
            .await
            .map_err(|e| pack_err(io::Error::other(e.to_string())))?;
        let index = match (packed, sent) {
            (Ok(index), Ok(())) => index,
            // The upload's own error first: the packer's is then only that
            // the upload stopped.
            (_, Err(e)) | (Err(e), Ok(())) => {
                let _ = upload.abort().await;
                return Err(pack_err(e));
            }
        };
        upload.shutdown().await.map_err(pack_err)?;
        let json = serde_json::to_vec(&index).expect("the index serializes");
        self.store
            .put(&key(id, "index.json"), PutPayload::from(json))
            .await
            .map_err(|e| self.err(e))?;
        if let Some(log) = log {
            match tokio::fs::File::open(log).await {
                Ok(mut file) => {
                    let mut up = object_store::buffered::BufWriter::new(
                        self.store.clone(),
                        key(id, "session.jsonl"),
                    );
                    if let Err(e) = tokio::io::copy(&mut file, &mut up).await {
                        let _ = up.abort().await;
                        return Err(pack_err(e));
                    }
                    up.shutdown().await.map_err(pack_err)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(pack_err(e)),
            }
        }
        Ok(true)
    }

    /// Job `id`'s index, as the process that archived it wrote it.
    pub async fn index(&self, id: &str) -> Result<Arc<Tree>, ArchiveError> {
        if let Some(tree) = lock(&self.cache)
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, t)| t.clone())
        {
            return Ok(tree);
        }
        let got = self
            .store
            .get(&key(id, "index.json"))
            .await
            .map_err(|e| self.err(e))?;
        let bytes = got.bytes().await.map_err(|e| self.err(e))?;
        let index: Index = serde_json::from_slice(&bytes).map_err(|e| ArchiveError::Index {
            id: id.to_string(),
            why: e.to_string(),
        })?;
        if index.version != INDEX_VERSION {
            return Err(ArchiveError::Index {
                id: id.to_string(),
                why: format!(
                    "version {} (this build reads {INDEX_VERSION})",
                    index.version
                ),
            });
        }
        let tree = Arc::new(Tree::new(index));
        if tree.entries.len() <= CACHED_ENTRIES_MAX {
            let mut cache = lock(&self.cache);
            if cache.len() >= CACHED_INDEXES {
                cache.pop_front();
            }
            cache.push_back((id.to_string(), tree.clone()));
        }
        Ok(tree)
    }

    /// The bytes `range` of job `id`'s tar, as they come.
    pub async fn range(
        &self,
        id: &str,
        range: Range<u64>,
    ) -> Result<BoxStream<'static, object_store::Result<Bytes>>, ArchiveError> {
        if range.is_empty() {
            return Ok(futures_util::stream::empty().boxed());
        }
        let opts = GetOptions {
            range: Some(GetRange::Bounded(range)),
            ..GetOptions::default()
        };
        let got = self
            .store
            .get_opts(&key(id, "workspace.tar"), opts)
            .await
            .map_err(|e| self.err(e))?;
        Ok(got.into_stream())
    }

    /// Keeps `data` as `path` of queued job `id`'s workspace until a
    /// worker takes the job ([`Archive::unstage`]); true if no file was
    /// staged there before.
    pub async fn stage(&self, id: &str, path: &WsPath, data: Bytes) -> Result<bool, ArchiveError> {
        let rel = path.rel.to_string_lossy();
        if rel == "." {
            return Err(ArchiveError::Staging(
                "the workspace itself is a directory; name a file in it".into(),
            ));
        }
        if rel.len() > MAX_STAGED_PATH {
            return Err(ArchiveError::Staging(format!(
                "{}: a file written before the job runs may have a path of at most \
                 {MAX_STAGED_PATH} bytes; write it once the job runs",
                path.display()
            )));
        }
        let key = staged_key(id, &rel);
        let new = match self.store.head(&key).await {
            Ok(_) => false,
            Err(object_store::Error::NotFound { .. }) => true,
            Err(e) => return Err(self.err(e)),
        };
        if new && self.staged(id).await?.len() >= MAX_STAGED {
            return Err(ArchiveError::Staging(format!(
                "job {id} has {MAX_STAGED} files written before it runs, the most it may; \
                 write the rest once it runs, or send one archive of them"
            )));
        }
        self.store
            .put(&key, PutPayload::from(data))
            .await
            .map_err(|e| self.err(e))?;
        Ok(new)
    }

    /// Removes what was staged as `path` for job `id`, if anything was.
    pub async fn unstage_path(&self, id: &str, path: &WsPath) -> Result<(), ArchiveError> {
        match self
            .store
            .delete(&staged_key(id, &path.rel.to_string_lossy()))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Writes the files staged for job `id` into its workspace at `root`
    /// (beneath it, as the files API writes), then removes them from the
    /// archive; answers how many there were.
    pub async fn unstage(&self, id: &str, root: &Path) -> Result<usize, ArchiveError> {
        let staged = self.staged(id).await?;
        let write_err = |why: String| ArchiveError::Staging(why);
        for (key, rel) in &staged {
            let data = self
                .store
                .get(key)
                .await
                .map_err(|e| self.err(e))?
                .bytes()
                .await
                .map_err(|e| self.err(e))?;
            let path = WsPath::parse(rel).map_err(|e| write_err(e.to_string()))?;
            let ws = Workspace::open(root).map_err(|e| write_err(e.to_string()))?;
            tokio::task::spawn_blocking(move || ws.write(&path, &data))
                .await
                .map_err(|e| write_err(e.to_string()))?
                .map_err(|e| write_err(e.to_string()))?;
        }
        for (key, _) in &staged {
            match self.store.delete(key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(staged.len())
    }

    /// The files staged for job `id`: each one's key and path.
    async fn staged(&self, id: &str) -> Result<Vec<(Key, String)>, ArchiveError> {
        let prefix = Key::from(format!("jobs/{id}/inbox"));
        let mut out = Vec::new();
        let mut list = self.store.list(Some(&prefix));
        while let Some(meta) = list.next().await {
            let key = match meta {
                Ok(m) => m.location,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(self.err(e)),
            };
            let Some(rel) = key
                .filename()
                .and_then(|hex| hex::decode(hex).ok())
                .and_then(|b| String::from_utf8(b).ok())
            else {
                continue;
            };
            out.push((key, rel));
        }
        Ok(out)
    }

    /// Removes everything kept of job `id`; what is gone already is fine.
    pub async fn forget(&self, id: &str) -> Result<(), ArchiveError> {
        lock(&self.cache).retain(|(k, _)| k != id);
        let prefix = Key::from(format!("jobs/{id}"));
        let keys: Vec<_> = self
            .store
            .list(Some(&prefix))
            .map(|m| m.map(|m| m.location))
            .collect()
            .await;
        for k in keys {
            match k {
                Ok(k) => match self.store.delete(&k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.err(e)),
                },
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A staged file's key: its path in hex, so that any name is one plain
/// key part.
fn staged_key(id: &str, rel: &str) -> Key {
    Key::from(format!("jobs/{id}/inbox/{}", hex::encode(rel.as_bytes())))
}

fn key(id: &str, name: &str) -> Key {
    Key::from(format!("jobs/{id}/{name}"))
}

/// A job id in the archive's busy set while its guard lives.
struct Busy<'a> {
    set: &'a Mutex<HashSet<String>>,
    id: String,
}

impl<'a> Busy<'a> {
    fn take(set: &'a Mutex<HashSet<String>>, id: &str) -> Option<Busy<'a>> {
        let fresh = lock(set).insert(id.to_string());
        fresh.then(|| Busy {
            set,
            id: id.to_string(),
        })
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.id);
    }
}

/// What an archive holds: its entries, with where each file's bytes are
/// in the tar.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    pub version: u32,
    /// False when the workspace held more entries than an archive takes.
    pub complete: bool,
    pub entries: Vec<Item>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// Relative to the workspace, `/`-separated; a name that is not UTF-8
    /// is shown with replacement characters, as the files API lists it.
    pub path: String,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Kind {
    File { size: u64, offset: u64 },
    Directory,
    Symlink { target: String },
}

/// An index, looked up by path.
#[derive(Debug)]
pub struct Tree {
    entries: BTreeMap<String, Kind>,
    pub complete: bool,
}

/// A path found in a [`Tree`]: its name there (links followed) and kind.
#[derive(Debug, PartialEq, Eq)]
pub struct Found<'t> {
    pub path: String,
    pub kind: &'t Kind,
}

static ROOT: Kind = Kind::Directory;

impl Tree {
    fn new(index: Index) -> Tree {
        Tree {
            entries: index
                .entries
                .into_iter()
                .map(|i| (i.path, i.kind))
                .collect(),
            complete: index.complete,
        }
    }

    /// Resolves `path` as `openat2` with `RESOLVE_BENEATH` would on disk:
    /// links are followed within the workspace, an absolute link or one
    /// that climbs out of it is refused, and so is a loop.
    pub fn resolve(&self, path: &WsPath) -> Result<Found<'_>, WorkspaceError> {
        let shown = || path.display();
        let mut todo: VecDeque<String> = path
            .rel
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let mut at: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            match name.as_str() {
                "" | "." => continue,
                ".." => {
                    if at.pop().is_none() {
                        return Err(WorkspaceError::Escapes { path: shown() });
                    }
                    continue;
                }
                _ => {}
            }
            at.push(name);
            match self.entries.get(&at.join("/")) {
                None => return Err(WorkspaceError::NotFound { path: shown() }),
                Some(Kind::Symlink { target }) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(WorkspaceError::Loop { path: shown() });
                    }
                    if target.starts_with('/') {
                        return Err(WorkspaceError::Escapes { path: shown() });
                    }
                    at.pop();
                    for part in target.split('/').rev() {
                        todo.push_front(part.to_string());
                    }
                }
                Some(Kind::File { .. }) if !todo.is_empty() => {
                    return Err(WorkspaceError::NotDirectory { path: shown() });
                }
                Some(_) => {}
            }
        }
        let path = at.join("/");
        let kind = if path.is_empty() {
            &ROOT
        } else {
            self.entries.get(&path).expect("resolved to an entry")
        };
        Ok(Found { path, kind })
    }

    /// The names directly in directory `dir` (as [`Found::path`] gives it),
    /// sorted, each with its kind.
    pub fn children<'t>(&'t self, dir: &'t str) -> impl Iterator<Item = (&'t str, &'t Kind)> + 't {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.entries
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .filter_map(move |(k, v)| {
                let name = &k[prefix_len(dir)..];
                (!name.is_empty() && !name.contains('/')).then_some((name, v))
            })
    }
}

fn prefix_len(dir: &str) -> usize {
    if dir.is_empty() { 0 } else { dir.len() + 1 }
}

/// Writes the tar of the workspace at `root` to `out`, answering its
/// index. Runs on a blocking thread.
fn pack(root: &Path, out: impl Write) -> io::Result<Index> {
    let ws = Workspace::open(root).map_err(io::Error::other)?;
    let mut tar = tar::Builder::new(Counted { inner: out, at: 0 });
    let mut entries = Vec::new();
    let mut complete = true;
    let mut dirs = vec![PathBuf::new()];
    'walk: while let Some(dir) = dirs.pop() {
        let at = WsPath {
            rel: if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir.clone()
            },
        };
        // Held open while its /proc path is read.
        let (_fd, proc) = match ws.open_dir(&at) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("archive: leaving out {}: {e}", at.display());
                continue;
            }
        };
        // What cannot be read (a directory the job locked) is left out, and
        // said: one such entry must not keep the rest out of the archive.
        let mut names: Vec<_> = match std::fs::read_dir(&proc) {
            Ok(d) => d.filter_map(Result::ok).collect(),
            Err(e) => {
                tracing::warn!("archive: leaving out {}: {e}", at.display());
                continue;
            }
        };
        names.sort_by_key(|e| e.file_name());
        for e in names {
            if entries.len() >= MAX_ENTRIES {
                complete = false;
                break 'walk;
            }
            let rel = dir.join(e.file_name());
            let path = rel.to_string_lossy().into_owned();
            // Of the entry itself, never of what a link names.
            let Ok(meta) = e.metadata() else { continue };
            let mut header = tar::Header::new_gnu();
            header.set_mode(meta.permissions().mode() & 0o777);
            header.set_mtime(meta.mtime().max(0) as u64);
            header.set_uid(0);
            header.set_gid(0);
            let kind = if meta.is_dir() {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                tar.append_data(&mut header, &rel, io::empty())?;
                dirs.push(rel);
                Kind::Directory
            } else if meta.is_symlink() {
                let Ok(target) = std::fs::read_link(proc.join(e.file_name())) else {
                    continue;
                };
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                tar.append_link(&mut header, &rel, &target)?;
                Kind::Symlink {
                    target: target.to_string_lossy().into_owned(),
                }
            } else if meta.is_file() {
                let (file, size) = match ws.open_read(&WsPath { rel: rel.clone() }) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!("archive: leaving out {path}: {e}");
                        continue;
                    }
                };
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(size);
                // Exactly `size` bytes, whatever the file does meanwhile.
                let data = file.take(size).chain(io::repeat(0)).take(size);
                tar.append_data(&mut header, &rel, data)?;
                let end = tar.get_ref().at;
                let offset = end - size.next_multiple_of(512);
                Kind::File { size, offset }
            } else {
                continue;
            };
            entries.push(Item { path, kind });
        }
    }
    tar.into_inner()?.inner.flush()?;
    Ok(Index {
        version: INDEX_VERSION,
        complete,
        entries,
    })
}

/// A writer that counts what it is given: the tar's offsets.
struct Counted<W> {
    inner: W,
    at: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A writer that hands its bytes, in chunks, to the upload.
struct Chunks {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Chunks {
    fn new(tx: tokio::sync::mpsc::Sender<Bytes>) -> Chunks {
        Chunks {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

impl Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(buf);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests;
