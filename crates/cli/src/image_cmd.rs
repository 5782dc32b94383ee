//! `cordon image`: the store of OCI images sandboxes run in.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use cordon_image::ImageRef;
use cordon_image::auth::Sources;
use cordon_image::obtain::fetch;
use cordon_image::store::{Image, Store};
use cordon_tools::printable;

use crate::environment::{open_store, say, short, show_output, size};

#[derive(Args, Debug)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Fetch an image into the store: NAME[:TAG] or NAME@DIGEST from a
    /// registry (loopback ones over plain HTTP), oci:DIR[:TAG], or
    /// docker-archive:FILE.
    Pull { reference: String },
    /// List the stored images.
    Ls {
        /// One JSON array of the images.
        #[arg(long)]
        json: bool,
    },
    /// Forget images (their layers go at the next prune).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove the blobs and layers no image uses.
    Prune,
    /// Build an image from a Dockerfile, every RUN in a sandbox of its own
    /// (docs/images.md)
    Build(BuildArgs),
    /// Send a stored image to a registry (loopback ones over plain HTTP):
    /// NAME, then the registry reference to push it as [default: its name]
    Push {
        name: String,
        target: Option<String>,
    },
    /// Save a running session's sandbox (its root's changes, not its
    /// workspace) as a new image on top of the one it started from
    Commit {
        /// The session's id (or the start of it)
        session: String,
        /// What the image is stored as [default: session-ID]
        name: Option<String>,
    },
    /// Write a stored image to a file other tools read
    Save {
        name: String,
        /// The file to write
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// oci (an OCI layout in a tar, `oci-archive:FILE` to skopeo) or
        /// docker-archive (what `docker load` reads)
        #[arg(long, default_value = "oci")]
        format: cordon_image::export::Format,
    },
}

#[derive(Args, Debug)]
struct BuildArgs {
    /// The Dockerfile [default: CONTEXT/Dockerfile]
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: Option<PathBuf>,
    /// What the image is stored as: NAME[:TAG]
    #[arg(short = 't', long = "tag", value_name = "NAME")]
    tag: Option<String>,
    /// A build argument, for an ARG of the Dockerfile (repeatable)
    #[arg(long = "build-arg", value_name = "K=V", value_parser = crate::options::parse_env)]
    build_args: Vec<(String, String)>,
    /// Build this stage (a name or an index) rather than the last
    #[arg(long)]
    target: Option<String>,
    /// Run every step again, taking nothing from the cache
    #[arg(long)]
    no_cache: bool,
    /// Let RUN steps reach HOST[:PORT] through cordon's broker (repeatable;
    /// *.DOMAIN, IP/CIDR, or a preset: @python @node @rust @debian) [default: no network]
    #[arg(long = "allow", value_name = "HOST")]
    allow: Vec<String>,
    /// Memory limit of each RUN step's sandbox
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = cordon_sandbox::parse_size)]
    memory: u64,
    /// Maximum number of processes in each RUN step's sandbox
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pids: u64,
    /// The most one step may add: files a COPY or ADD takes from the
    /// context, files a RUN writes
    #[arg(long, value_name = "SIZE", default_value = "10G", value_parser = cordon_sandbox::parse_size)]
    disk: u64,
    /// Trust this host's certificate authorities in RUN steps too (for a
    /// network whose proxy re-signs TLS); the image does not keep them
    #[arg(long)]
    host_certs: bool,
    /// The directory whose files COPY and ADD read
    #[arg(value_name = "CONTEXT")]
    context: PathBuf,
}

pub async fn image(args: ImageArgs) -> i32 {
    let store = match open_store() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon: {e}");
            return crate::exit::CONFIG;
        }
    };
    match args.command {
        ImageCommand::Pull { reference } => match pull(&store, &reference).await {
            Ok(image) => {
                println!(
                    "{} {} ({} layers, {})",
                    printable(&image.name),
                    image.manifest,
                    image.layers.len(),
                    size(image.size)
                );
                0
            }
            Err(e) => {
                eprintln!("cordon: {e}");
                crate::exit::SANDBOX
            }
        },
        ImageCommand::Ls { json } => {
            let images = store.list();
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&images).expect("images serialise")
                );
            } else {
                print!("{}", table(&images));
            }
            0
        }
        ImageCommand::Rm { names } => {
            let mut code = 0;
            for name in names {
                match store.remove(&name) {
                    Ok(true) => println!("removed {}", printable(&name)),
                    Ok(false) => {
                        eprintln!(
                            "cordon: no image {} (cordon image ls lists them)",
                            printable(&name)
                        );
                        code = 1;
                    }
                    Err(e) => {
                        eprintln!("cordon: {e}");
                        code = 1;
                    }
                }
            }
            code
        }
        ImageCommand::Build(args) => build(&store, args).await,
        ImageCommand::Push { name, target } => push(&store, &name, target.as_deref()).await,
        ImageCommand::Commit { session, name } => {
            let store = store.clone();
            let done = tokio::task::spawn_blocking(move || commit(&store, &session, name)).await;
            match done {
                Ok(Ok(image)) => {
                    println!("{} {}", printable(&image.name), image.manifest);
                    0
                }
                Ok(Err(e)) => {
                    eprintln!("cordon: {}", printable(&e));
                    1
                }
                Err(e) => {
                    eprintln!("cordon: {e}");
                    1
                }
            }
        }
        ImageCommand::Save {
            name,
            output,
            format,
        } => {
            let Some(image) = cordon_image::obtain::stored(&store, &name) else {
                eprintln!(
                    "cordon: no image {} (cordon image ls lists them)",
                    printable(&name)
                );
                return 1;
            };
            let store = store.clone();
            // An OCI layout's tag is a tag (what `oci:DIR:TAG` names), a
            // Docker archive's the whole name.
            let tag = match format {
                cordon_image::export::Format::Oci => tag_of(&image.name).to_string(),
                cordon_image::export::Format::DockerArchive => image.name.clone(),
            };
            let out = output.clone();
            let saved =
                tokio::task::spawn_blocking(move || store.save(&image, format, &tag, &out)).await;
            match saved {
                Ok(Ok(())) => {
                    eprintln!("saved {} to {}", printable(&name), output.display());
                    0
                }
                Ok(Err(e)) => {
                    eprintln!("cordon: {e}");
                    1
                }
                Err(e) => {
                    eprintln!("cordon: {e}");
                    1
                }
            }
        }
        ImageCommand::Prune => match store.prune() {
            Ok(freed) => {
                println!("freed {}", size(freed));
                0
            }
            Err(e) => {
                eprintln!("cordon: {e}");
                1
            }
        },
    }
}

/// `cordon image build`: progress on standard error, the image's name on
/// standard output.
async fn build(store: &Store, args: BuildArgs) -> i32 {
    use cordon_build::{Builder, Event, Options};
    let path = args
        .file
        .clone()
        .unwrap_or_else(|| args.context.join("Dockerfile"));
    let dockerfile = match read_dockerfile(&path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("cordon: {e}");
            return crate::exit::CONFIG;
        }
    };
    let workspace = std::env::current_dir().unwrap_or_else(|_| args.context.clone());
    let sandbox = match crate::environment::step_sandbox(
        &workspace,
        &args.allow,
        args.memory,
        args.pids,
        args.host_certs,
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cordon: {e}");
            return crate::exit::CONFIG;
        }
    };
    let credentials = Sources::from_env();
    let builder = Builder {
        store,
        sandbox,
        credentials: &credentials,
        bases: None,
    };
    let opts = Options {
        context: args.context.clone(),
        dockerfile,
        tag: args.tag.clone(),
        build_args: args.build_args.clone(),
        target: args.target.clone(),
        no_cache: args.no_cache,
        budget: args.disk,
        dockerignore: true,
        cache_scope: String::new(),
    };
    let started = std::time::Instant::now();
    let show = |e: Event| match e {
        Event::Stage { index, name, base } => eprintln!(
            "stage {index}{}: FROM {}",
            name.map(|n| format!(" ({})", printable(&n)))
                .unwrap_or_default(),
            printable(&base)
        ),
        Event::Step { line, text, cached } => eprintln!(
            "  line {line}: {}{}",
            printable(&text),
            if cached { "  (cached)" } else { "" }
        ),
        Event::Output(bytes) => show_output(&bytes),
    };
    match builder.build(&opts, &show).await {
        Ok(built) => {
            eprintln!(
                "built in {:.2} s: {} steps run, {} cached",
                started.elapsed().as_secs_f64(),
                built.ran,
                built.cached
            );
            println!("{} {}", printable(&built.image.name), built.image.manifest);
            0
        }
        Err(e) => {
            eprintln!(
                "cordon: build failed: {}",
                cordon_tools::printable_lines(&e.to_string())
            );
            1
        }
    }
}

/// The tag of an image's name: what follows the last `:` after the last
/// `/`, else `latest`.
fn tag_of(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    let last = last.split('@').next().unwrap_or(last);
    last.rsplit_once(':').map_or("latest", |(_, t)| t)
}

/// `cordon image push NAME [TARGET]`.
async fn push(store: &Store, name: &str, target: Option<&str>) -> i32 {
    use cordon_image::push::PushProgress;
    let Some(image) = cordon_image::obtain::stored(store, name) else {
        eprintln!(
            "cordon: no image {} (cordon image ls lists them)",
            printable(name)
        );
        return 1;
    };
    let target_text = target.unwrap_or(&image.name);
    let target: ImageRef = match target_text.parse() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cordon: {e}");
            return crate::exit::CONFIG;
        }
    };
    let ImageRef::Registry(r) = &target else {
        eprintln!(
            "cordon: {} is not a registry reference; `cordon image save` writes files",
            printable(target_text)
        );
        return crate::exit::CONFIG;
    };
    let credentials = Sources::from_env().for_registry(r.registry(), r.repository());
    let shown = |p: PushProgress| match p {
        PushProgress::Sending { digest, size: n } => {
            eprintln!("  sending {} ({})", short(&digest.to_string()), size(n))
        }
        PushProgress::Present { digest } => {
            eprintln!("  {} already there", short(&digest.to_string()))
        }
    };
    match cordon_image::push::push(store, &image, &target, credentials, &shown).await {
        Ok(digest) => {
            println!("{} {digest}", printable(&target.to_string()));
            0
        }
        Err(e) => {
            eprintln!("cordon: {e}");
            1
        }
    }
}

/// `cordon image commit SESSION [NAME]`, and `/snapshot` in the terminal
/// UI: the image is stored under `name` (as a reference names it), or
/// `session-ID`.
pub fn commit(store: &Store, session: &str, name: Option<String>) -> Result<Image, String> {
    let dir = cordon_build::commit::find_live(store, session).map_err(|e| e.to_string())?;
    // Written by cordon beside the layer, where no sandbox writes.
    let supervisor = std::fs::read_to_string(dir.join(cordon_sandbox::SUPERVISOR_FILE))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let upper = cordon_sandbox::live_upper(&dir, supervisor).ok_or_else(|| {
        "the session's root changes cannot be read from here (its sandbox is a microVM, or \
         has ended)"
            .to_string()
    })?;
    commit_in(store, &dir, &upper, session, name)
}

/// [`commit`] of the sandbox whose writable layer is `dir`, its changes in
/// `upper`: the terminal UI's, which has them at hand.
pub fn commit_dir(
    dir: &std::path::Path,
    upper: &std::path::Path,
    session: &str,
    name: Option<String>,
) -> Result<Image, String> {
    commit_in(&open_store()?, dir, upper, session, name)
}

fn commit_in(
    store: &Store,
    dir: &std::path::Path,
    upper: &std::path::Path,
    session: &str,
    name: Option<String>,
) -> Result<Image, String> {
    let name = stored_name(name.unwrap_or_else(|| {
        let id: String = session
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
        format!("session-{}", id.to_ascii_lowercase())
    }))?;
    cordon_build::commit::commit_upper(store, dir, upper, &name).map_err(|e| e.to_string())
}

/// A name as the store keeps it: a reference, in full.
pub fn stored_name(name: String) -> Result<String, String> {
    name.parse::<ImageRef>()
        .map(|r| r.to_string())
        .map_err(|e| format!("{}: {e}", printable(&name)))
}

/// The Dockerfile, as text: the user's own file, refused past 1 MiB.
fn read_dockerfile(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(1 << 20)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() >= 1 << 20 {
        return Err(format!("{}: larger than 1 MiB", path.display()));
    }
    Ok(text)
}

fn table(images: &[Image]) -> String {
    if images.is_empty() {
        return "no images (cordon image pull REF fetches one)\n".into();
    }
    let names: Vec<String> = images.iter().map(|i| printable(&i.name)).collect();
    let w = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!("{:w$}  {:>10}  {:>6}  MANIFEST\n", "NAME", "SIZE", "LAYERS");
    for (i, name) in images.iter().zip(&names) {
        out.push_str(&format!(
            "{name:w$}  {:>10}  {:>6}  {}\n",
            size(i.size),
            i.layers.len(),
            short(&i.manifest.to_string())
        ));
    }
    out
}

/// Fetches `reference` into the store, with progress on standard error.
async fn pull(store: &Store, reference: &str) -> Result<Image, String> {
    let parsed: ImageRef = reference.parse().map_err(|e| format!("{e}"))?;
    fetch(store, &parsed, &Sources::from_env(), &say)
        .await
        .map_err(|e| e.to_string())
}
