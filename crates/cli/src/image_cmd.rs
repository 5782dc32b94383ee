//! `cordon image`: the store of OCI images sandboxes run in.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use cordon_image::ImageRef;
use cordon_image::auth::Sources;
use cordon_image::obtain::{Step, fetch, obtain};
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
    let image = obtain(&store, &reference, &Sources::from_env(), &say)
        .await
        .map_err(|e| e.to_string())?;
    let root = store
        .sandbox_root(&image, user)
        .map_err(|e| format!("{}: {e}", printable(&image.name)))?;
    let working_dir = root.working_dir.clone();
    c.image = Some(root.into());
    Ok(working_dir)
}

/// A pull's progress, on standard error.
fn say(step: Step) {
    match step {
        Step::Pulling { name } => eprintln!("cordon: pulling {}", printable(&name)),
        Step::Pull(Progress::Fetching { digest, size: n }) => {
            eprintln!("  fetching {} ({})", short(&digest.to_string()), size(n))
        }
        Step::Pull(Progress::Fetched { .. }) => {}
        Step::Pull(Progress::Present { digest }) => {
            eprintln!("  {} already here", short(&digest.to_string()))
        }
        Step::Pull(Progress::Unpacking) => eprintln!("  unpacking"),
    }
}

/// Fetches `reference` into the store, with progress on standard error.
pub async fn pull(store: &Store, reference: &str) -> Result<Image, String> {
    let parsed: ImageRef = reference.parse().map_err(|e| format!("{e}"))?;
    fetch(store, &parsed, &Sources::from_env(), &say)
        .await
        .map_err(|e| e.to_string())
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
