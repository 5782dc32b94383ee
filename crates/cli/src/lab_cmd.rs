//! `cordon lab setup`: installs the pinned JupyterLab and ipykernel into
//! cordon's cache (see `cordon_lab`), which sandboxes get read-only.

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Subcommand, Debug)]
enum LabCommand {
    /// Install the pinned JupyterLab and ipykernel from the Python
    /// registry into cordon's cache (never the system's Python); safe to
    /// run again.
    Setup,
}

pub fn lab(args: LabArgs) -> i32 {
    match args.command {
        LabCommand::Setup => {
            let cache = cordon_lab::cache_dir();
            eprintln!("cordon lab setup: cache {}", cache.display());
            let mut progress = |line: &str| eprintln!("{line}");
            match cordon_lab::setup(&cache, &mut progress) {
                Ok(lab) => {
                    println!(
                        "JupyterLab {} and ipykernel {} ready: {}",
                        lab.versions.jupyterlab,
                        lab.versions.ipykernel,
                        lab.dir.display()
                    );
                    0
                }
                Err(e @ cordon_lab::LabError::NoPython) => {
                    eprintln!("cordon: {e}");
                    crate::exit::CONFIG
                }
                Err(e) => {
                    eprintln!("cordon: {e}");
                    1
                }
            }
        }
    }
}
