//! `cordon image`: the store of OCI images sandboxes run in.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use cordon_image::ImageRef;
use cordon_image::auth::Sources;
use cordon_image::registry::Progress;
use cordon_image::store::{self, Image, Store};
use cordon_tools::printable;

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
}

fn open_store() -> Result<Store, String> {
    let root: PathBuf = store::default_root()
        .ok_or("neither CORDON_IMAGE_STORE nor HOME is set: nowhere to keep images")?;
    Store::open(&root).map_err(|e| e.to_string())
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

/// Makes the root of `c` the image the settings name (`--image`,
/// `sandbox.image`, `CORDON_IMAGE`), pulling or importing it first when
/// the store lacks it, running as `user` or the image's own; returns the
/// image's working directory. Without an image, nothing changes.
pub async fn apply(
    c: &mut cordon_sandbox::SandboxConfig,
    settings: &cordon_agent::config::Settings,
    user: Option<&str>,
) -> Result<Option<String>, String> {
    let Some(reference) = settings.resolved().sandbox.image.clone() else {
        if user.is_some() {
            return Err("--user chooses a user of an image: give the image with --image".into());
        }
        return Ok(None);
    };
    let store = open_store()?;
    // A registry's image stored under the very name typed needs no parse
    // (the reference grammar's regex takes tens of milliseconds to build,
    // more than the rest of a sandbox's start).
    let local = reference.starts_with("oci:") || reference.starts_with("docker-archive:");
    if !local && let Some(image) = store.get(&reference).filter(|i| i.name == reference) {
        return finish(c, &store, &image, user);
    }
    let parsed: ImageRef = reference.parse().map_err(|e| format!("{e}"))?;
    let image = match (&parsed, store.get(&parsed.to_string())) {
        // A registry's tag is what was pulled until pulled again; a
        // layout or archive on disk is read again, as it may have changed
        // (only what the store lacks is unpacked).
        (ImageRef::Registry(_), Some(image)) => image,
        _ => {
            if matches!(parsed, ImageRef::Registry(_)) {
                eprintln!("cordon: pulling {}", printable(&parsed.to_string()));
            }
            pull(&store, &reference).await?
        }
    };
    finish(c, &store, &image, user)
}

/// Makes `image` the root of `c`; its working directory.
fn finish(
    c: &mut cordon_sandbox::SandboxConfig,
    store: &Store,
    image: &Image,
    user: Option<&str>,
) -> Result<Option<String>, String> {
    let root = store
        .sandbox_root(image, user)
        .map_err(|e| format!("{}: {e}", printable(&image.name)))?;
    c.image = Some(cordon_sandbox::RootImage {
        layers: root.layers,
        scratch: root.scratch,
        uid: root.uid,
        gid: root.gid,
        env: root.env,
    });
    Ok(root.working_dir)
}

/// Fetches `reference` into the store, with progress on standard error.
pub async fn pull(store: &Store, reference: &str) -> Result<Image, String> {
    let parsed: ImageRef = reference.parse().map_err(|e| format!("{e}"))?;
    match &parsed {
        ImageRef::Registry(r) => {
            let creds = Sources::from_env().for_registry(r.registry(), r.repository());
            let say = |p: Progress| match p {
                Progress::Fetching { digest, size: n } => {
                    eprintln!("  fetching {} ({})", short(&digest.to_string()), size(n))
                }
                Progress::Fetched { .. } => {}
                Progress::Present { digest } => {
                    eprintln!("  {} already here", short(&digest.to_string()))
                }
                Progress::Unpacking => eprintln!("  unpacking"),
            };
            cordon_image::registry::pull(store, &parsed, creds, &say)
                .await
                .map_err(|e| {
                    let e = e.to_string();
                    if e.contains("Not authorized") {
                        format!(
                            "{e}\n  log in with `podman login`, `skopeo login` or `docker login`: cordon reads the credentials they save (docs/images.md)"
                        )
                    } else {
                        e
                    }
                })
        }
        ImageRef::Layout { dir, tag } => {
            let (store, dir, tag, name) =
                (store.clone(), dir.clone(), tag.clone(), parsed.to_string());
            tokio::task::spawn_blocking(move || store.import_layout(&dir, tag.as_deref(), &name))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        }
        ImageRef::DockerArchive(file) => {
            let (store, file, name) = (store.clone(), file.clone(), parsed.to_string());
            tokio::task::spawn_blocking(move || store.import_archive(&file, &name))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        }
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
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
