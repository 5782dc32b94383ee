//! `cordon vm setup`: fetches and prepares what the microvm backend needs
//! that a fresh machine lacks (the distribution's kernel), into a cache.

use clap::{Args, Subcommand};
use cordon_sandbox::microvm::image;

#[derive(Args, Debug)]
pub struct VmArgs {
    #[command(subcommand)]
    command: VmCommand,
}

#[derive(Subcommand, Debug)]
enum VmCommand {
    /// Download the guest kernel through the package manager (without
    /// installing it on this machine) and prepare it; safe to run again.
    Setup,
}

pub fn vm(args: VmArgs) -> i32 {
    match args.command {
        VmCommand::Setup => {
            let cache = image::cache_dir();
            eprintln!("cordon vm setup: cache {}", cache.display());
            let mut progress = |line: &str| eprintln!("  {line}");
            match image::setup(&cache, &mut progress) {
                Ok(k) => {
                    println!("guest kernel {} ready: {}", k.version, k.vmlinux.display());
                    let probe = cordon_sandbox::SandboxConfig::new(".");
                    if let Err(e) = cordon_sandbox::microvm::qemu_path(&probe) {
                        eprintln!("cordon: {e}");
                        return crate::exit::CONFIG;
                    }
                    0
                }
                Err(e) => {
                    eprintln!("cordon: {e}");
                    crate::exit::SANDBOX
                }
            }
        }
    }
}
