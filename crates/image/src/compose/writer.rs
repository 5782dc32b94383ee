//! A new layer's tar, stored while it is written: compressed into its
//! blob and unpacked into the store at once, each on threads of its own.
//!
//! A build step's layer can be a gigabyte, and writing it is most of what
//! a build does after its commands: compressing and then unpacking that
//! blob one after the other took longer than `apt-get install` itself. So
//! the tar is cut into chunks as it comes. Each chunk is compressed as a
//! gzip member of its own, by as many threads as there are cores, and the
//! members are written in order (a series of members is one gzip file,
//! RFC 1952, and every client reads it so). The same chunks go, uncompressed,
//! to an unpack by the store's rules for any layer: a layer cordon made is
//! no more trusted than one it fetched, it is just not gunzipped again.
//!
//! Every queue is bounded, so memory is a few chunks per thread whatever
//! the layer's size. Dropped before [`LayerWriter::finish`], the writer
//! stores nothing: its threads see their queues close and remove their
//! files.

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Read, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flate2::write::GzEncoder;

use super::{GZIP_LAYER, Layer};
use crate::digest::{Digest, Hashing};
use crate::store::{Store, StoreError, invalid};
use crate::unpack::{self, Report, UnpackError};

/// Bytes of tar per gzip member: large enough that the members cost
/// nothing in size (the window is 32 KiB), small enough to spread a small
/// layer over the threads.
const CHUNK: usize = 1 << 20;
/// Chunks queued for each thread, at most.
const QUEUED: usize = 4;
/// Threads compressing, at most: beyond this, the disk is the limit.
const MAX_COMPRESSORS: usize = 4;

type Chunk = Arc<Vec<u8>>;

/// Writes a new layer's tar; [`LayerWriter::finish`] stores it.
pub struct LayerWriter<'s> {
    store: &'s Store,
    chunk: Vec<u8>,
    /// Chunks sent so far.
    sent: u64,
    /// `None` once a thread has failed and its error has been returned.
    pipes: Option<Pipes>,
}

/// The writer's ends of its queues, and its threads.
struct Pipes {
    compress: SyncSender<(u64, Chunk)>,
    unpack: SyncSender<Chunk>,
    compressors: Vec<JoinHandle<()>>,
    blob: JoinHandle<Result<Blob, StoreError>>,
    unpacker: JoinHandle<Result<(Report, tempfile::TempDir), UnpackError>>,
}

/// The compressed layer, in a file of the store's `tmp/`.
struct Blob {
    digest: Digest,
    size: u64,
    file: tempfile::NamedTempFile,
}

impl Store {
    /// A writer of a new layer's tar.
    pub fn layer_writer(&self) -> Result<LayerWriter<'_>, StoreError> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_COMPRESSORS);
        let spawn_err = |e| StoreError::Io {
            what: "starting a layer's threads".into(),
            source: e,
        };
        let file = self.blob_file()?;
        let (scratch, limits, owners) = self.unpack_site()?;

        let (members_tx, members_rx) = sync_channel::<(u64, Vec<u8>)>(threads * QUEUED);
        let blob = std::thread::Builder::new()
            .name("cordon-layer-blob".into())
            .spawn(move || write_blob(file, members_rx))
            .map_err(spawn_err)?;

        let (compress, work) = sync_channel::<(u64, Chunk)>(threads * QUEUED);
        let work = Arc::new(Mutex::new(work));
        let compressors = (0..threads)
            .map(|_| {
                let work = Arc::clone(&work);
                let members = members_tx.clone();
                std::thread::Builder::new()
                    .name("cordon-layer-gzip".into())
                    .spawn(move || compress_chunks(&work, &members))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(spawn_err)?;

        let (unpack, chunks) = sync_channel::<Chunk>(QUEUED);
        let unpacker = std::thread::Builder::new()
            .name("cordon-layer-unpack".into())
            .spawn(move || {
                let report =
                    unpack::unpack_plain(ChunkReader::new(chunks), scratch.path(), limits, owners)?;
                Ok((report, scratch))
            })
            .map_err(spawn_err)?;

        Ok(LayerWriter {
            store: self,
            chunk: Vec::with_capacity(CHUNK),
            sent: 0,
            pipes: Some(Pipes {
                compress,
                unpack,
                compressors,
                blob,
                unpacker,
            }),
        })
    }
}

impl Write for LayerWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK - self.chunk.len());
        self.chunk.extend_from_slice(&buf[..n]);
        if self.chunk.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl LayerWriter<'_> {
    /// Hands the chunk so far to both pipelines.
    fn send(&mut self) -> io::Result<()> {
        let chunk: Chunk = Arc::new(std::mem::replace(
            &mut self.chunk,
            Vec::with_capacity(CHUNK),
        ));
        let Some(pipes) = &self.pipes else {
            return Err(io::Error::other("the layer was already refused"));
        };
        let sent = pipes.unpack.send(Arc::clone(&chunk)).is_ok()
            && pipes.compress.send((self.sent, chunk)).is_ok();
        if !sent {
            // A thread stopped early: only a failure does; say which.
            let pipes = self.pipes.take().expect("checked above");
            let why = match pipes.join() {
                Err(e) => e.to_string(),
                Ok(_) => "a layer's thread stopped".into(),
            };
            return Err(io::Error::other(why));
        }
        self.sent += 1;
        Ok(())
    }

    /// Stores the blob and the unpacked layer.
    pub fn finish(mut self) -> Result<Layer, StoreError> {
        // Even an empty stream is one (empty) member: a gzip file.
        if !self.chunk.is_empty() || self.sent == 0 {
            self.send().map_err(|e| StoreError::Io {
                what: "writing a layer".into(),
                source: e,
            })?;
        }
        let pipes = self
            .pipes
            .take()
            .ok_or_else(|| invalid("the layer was already refused"))?;
        let (blob, (report, scratch)) = pipes.join()?;
        let diff_id = report
            .diff_id
            .ok_or_else(|| invalid("the layer's unpack did not say its digest"))?;
        if !self.store.has_blob(&blob.digest) {
            self.store.persist_blob(blob.file, &blob.digest)?;
        }
        // Where the same layer is stored already (a step run again
        // without the cache), keep_layer keeps that one.
        self.store.keep_layer(scratch, &diff_id, &report)?;
        Ok(Layer {
            diff_id,
            digest: blob.digest,
            size: blob.size,
            media_type: GZIP_LAYER.into(),
        })
    }
}

impl Pipes {
    /// Closes the queues and waits for every thread: the blob and the
    /// unpacked tree, or the first cause of a failure (the blob's side
    /// first: a full disk there also cuts the unpack's stream short).
    #[allow(clippy::type_complexity)]
    fn join(self) -> Result<(Blob, (Report, tempfile::TempDir)), StoreError> {
        let Pipes {
            compress,
            unpack,
            compressors,
            blob,
            unpacker,
        } = self;
        drop((compress, unpack));
        let mut panicked = false;
        for c in compressors {
            panicked |= c.join().is_err();
        }
        let blob = blob
            .join()
            .map_err(|_| invalid("a layer's writer panicked"))?;
        let unpacked = unpacker
            .join()
            .map_err(|_| invalid("a layer's unpack panicked"))?;
        if panicked {
            return Err(invalid("a layer's compressor panicked"));
        }
        let blob = blob?;
        Ok((blob, unpacked?))
    }
}

/// Compresses chunks from the shared queue, each into a gzip member.
fn compress_chunks(work: &Mutex<Receiver<(u64, Chunk)>>, members: &SyncSender<(u64, Vec<u8>)>) {
    loop {
        // Held only to take one chunk: the others compress meanwhile.
        let next = work.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok((n, chunk)) = next else { return };
        // Fast rather than small: a layer is written on every build step
        // and read only by a push or a save.
        let mut gz = GzEncoder::new(
            Vec::with_capacity(chunk.len() / 2),
            flate2::Compression::fast(),
        );
        let member = gz.write_all(&chunk).and_then(|()| gz.finish());
        let member = member.expect("compressing into memory does not fail");
        if members.send((n, member)).is_err() {
            return;
        }
    }
}

/// Writes the members to `file` in their order, hashing them.
fn write_blob(
    file: tempfile::NamedTempFile,
    members: Receiver<(u64, Vec<u8>)>,
) -> Result<Blob, StoreError> {
    let io_err = |source| StoreError::Io {
        what: "writing a layer's blob".into(),
        source,
    };
    let mut out = Hashing::new(BufWriter::with_capacity(CHUNK, file));
    let mut next = 0;
    let mut early = BTreeMap::new();
    for (n, member) in members {
        early.insert(n, member);
        while let Some(member) = early.remove(&next) {
            out.write_all(&member).map_err(io_err)?;
            next += 1;
        }
    }
    if !early.is_empty() {
        return Err(invalid("a layer's chunk went missing"));
    }
    let size = out.written;
    let (digest, buffered) = out.finish();
    let file = buffered.into_inner().map_err(|e| io_err(e.into_error()))?;
    Ok(Blob { digest, size, file })
}

/// The chunks of a queue as one stream; it ends when the queue closes.
struct ChunkReader {
    chunks: Receiver<Chunk>,
    current: Chunk,
    at: usize,
}

impl ChunkReader {
    fn new(chunks: Receiver<Chunk>) -> ChunkReader {
        ChunkReader {
            chunks,
            current: Arc::new(Vec::new()),
            at: 0,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            match self.chunks.recv() {
                Ok(chunk) => {
                    self.current = chunk;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
