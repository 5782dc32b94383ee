//! A `build` job: a Dockerfile built into one of the tenant's own images,
//! every `RUN` in a sandbox of the job's limits and network.
//!
//! The context (an archive the request carries, or the job's cloned
//! repository) is the tenant's, so hostile: the archive is unpacked
//! beneath the workspace by the image crate's unpacker (nothing followed,
//! no `..`, no devices, at most the job's disk budget), and the builder
//! reads it beneath its directory as the CLI's does. A `FROM` reaches only
//! what a job of the tenant's could name, and the step cache is the
//! tenant's own: no tenant takes a layer another's run wrote.

use std::path::Path;
use std::time::Instant;

use cordon_agent::Cancel;
use cordon_build::{BuildError, Builder, Event, Options};
use cordon_sandbox::Stream;
use tokio::sync::mpsc;

use super::Runner;
use super::sink::Sink;
use crate::job::{BuildResult, BuildSpec, JobResult, RunOptions};
use crate::store::{ImageOrigin, Outcome};

/// Largest Dockerfile read from the context.
const MAX_DOCKERFILE: u64 = 1 << 20;

impl Runner {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn build(
        &self,
        id: &str,
        tenant: &str,
        ws: &Path,
        options: &RunOptions,
        spec: &BuildSpec,
        deadline: Instant,
        sink: &mut Sink,
        cancel: &Cancel,
    ) -> Outcome {
        let store = match self.images.store() {
            Ok(s) => s.clone(),
            Err(e) => return Outcome::failed(e.message()),
        };
        let _hold = self.images.hold();
        if let Some(archive) = &spec.context {
            let (bytes, dest, budget) = (archive.bytes(), ws.to_path_buf(), options.disk);
            let unpacked = tokio::task::spawn_blocking(move || {
                let limits = cordon_image::unpack::Limits {
                    max_bytes: budget,
                    ..Default::default()
                };
                cordon_image::unpack::unpack(
                    bytes.as_slice(),
                    &dest,
                    limits,
                    cordon_image::unpack::Owners::Caller,
                )
            })
            .await;
            match unpacked {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Outcome::failed(format!("the build's `context`: {e}")),
                Err(e) => return Outcome::failed(e.to_string()),
            }
        }
        let dockerfile = match &spec.dockerfile {
            Some(text) => text.to_string(),
            None => match read_dockerfile(ws).await {
                Ok(text) => text,
                Err(e) => return Outcome::failed(e),
            },
        };
        let own = match self.store.own_images(tenant).await {
            Ok(own) => own,
            Err(e) => return Outcome::failed(e.to_string()),
        };
        let bases = self.images.bases(tenant, own);
        let credentials = cordon_image::auth::Sources::from_env();
        let builder = Builder {
            store: &store,
            sandbox: self.sandboxes.for_options(ws, None, options),
            credentials: &credentials,
            bases: Some(&bases),
        };
        let opts = Options {
            context: ws.to_path_buf(),
            dockerfile,
            tag: None,
            build_args: spec.build_args.clone().into_iter().collect(),
            target: spec.target.clone(),
            no_cache: spec.no_cache,
            budget: options.disk,
            dockerignore: true,
            cache_scope: format!("tenant\0{tenant}"),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let events = move |e: Event| {
            let _ = tx.send(e);
        };
        let built = {
            let build = builder.build(&opts, &events);
            tokio::pin!(build);
            let timeout = tokio::time::sleep_until(deadline.into());
            tokio::pin!(timeout);
            loop {
                tokio::select! {
                    r = &mut build => break r,
                    Some(e) = rx.recv() => report(sink, e).await,
                    _ = cancel.cancelled() => return Outcome::cancelled("cancelled"),
                    _ = &mut timeout => {
                        return Outcome::timed_out("the build ran past the job's timeout");
                    }
                }
            }
        };
        while let Ok(e) = rx.try_recv() {
            report(sink, e).await;
        }
        let built = match built {
            Ok(b) => b,
            Err(BuildError::Failed {
                line, text, code, ..
            }) => {
                return Outcome::failed(format!("line {line}: `{text}` exited with {code}"))
                    .with_exit_code(i64::from(code));
            }
            Err(e) => return Outcome::failed(e.to_string()),
        };
        // Made under a record of its own, then the tenant's if its quota
        // takes it; the builder's own name for it is not kept.
        let pending = crate::catalog::pending_record(tenant, &spec.name);
        let (for_record, manifest, built_name) = (
            store.clone(),
            built.image.manifest,
            built.image.name.clone(),
        );
        let image = tokio::task::spawn_blocking(move || {
            let image = for_record.import_blobs(&manifest, &pending);
            let _ = for_record.remove(&built_name);
            image
        })
        .await;
        let image = match image {
            Ok(Ok(image)) => image,
            Ok(Err(e)) => return Outcome::failed(e.to_string()),
            Err(e) => return Outcome::failed(e.to_string()),
        };
        let origin = ImageOrigin::Built(id.to_string());
        match self
            .images
            .keep(&self.store, tenant, &spec.name, image, origin)
            .await
        {
            Ok(own) => Outcome::succeeded().with_result(JobResult::Build(BuildResult {
                image: own.name,
                digest: own.digest,
                size: own.size,
                ran: built.ran,
                cached: built.cached,
            })),
            Err(e) => Outcome::failed(e.message()),
        }
    }
}

/// The context's `Dockerfile`, read beneath the workspace through no link.
async fn read_dockerfile(ws: &Path) -> Result<String, String> {
    let ws = ws.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let context = cordon_build::context::Context::open_plain(&ws)
            .map_err(|e| format!("the build's context: {e}"))?;
        let bytes = context
            .read_small(b"Dockerfile", MAX_DOCKERFILE)
            .map_err(|e| format!("the context's Dockerfile: {e}"))?
            .ok_or(
                "the context has no Dockerfile: give one in `dockerfile`, or put it at the \
                 context's top",
            )?;
        String::from_utf8(bytes).map_err(|_| "the context's Dockerfile is not UTF-8".to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// A build's progress, as the job's output: each stage and step on a line
/// of stdout, what its `RUN` printed as it came.
async fn report(sink: &mut Sink, e: Event) {
    match e {
        Event::Stage { index, name, base } => {
            let name = name.map(|n| format!(" AS {n}")).unwrap_or_default();
            let line = format!("[stage {}] FROM {base}{name}\n", index + 1);
            sink.output(Stream::Stdout, line.as_bytes()).await;
        }
        Event::Step { line, text, cached } => {
            let cached = if cached { " (cached)" } else { "" };
            let text = format!("line {line}: {text}{cached}\n");
            sink.output(Stream::Stdout, text.as_bytes()).await;
        }
        Event::Output(bytes) => sink.output(Stream::Stdout, &bytes).await,
    }
}
