//! Builds the microVM guest's init (guest/init.rs) as a static binary that
//! the sandbox crate embeds: it runs in the guest before any shared library
//! is reachable, so it cannot be an ordinary (dynamic) Cargo target. It is
//! one file of std, compiled by `rustc` alone with a static C library.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=guest/init.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("cordon-guest-init");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").unwrap_or_default();
    let built = target.contains("linux")
        && Command::new(rustc)
            .args([
                "--edition",
                "2024",
                "--crate-type",
                "bin",
                "--crate-name",
                "cordon_guest_init",
            ])
            .args([
                "-C",
                "opt-level=s",
                "-C",
                "panic=abort",
                "-C",
                "strip=symbols",
            ])
            .args(["-C", "target-feature=+crt-static", "--target", &target])
            .arg("guest/init.rs")
            .arg("-o")
            .arg(&out)
            .status()
            .is_ok_and(|s| s.success());
    if !built {
        // The native backend does not need it; the microvm backend says so.
        println!(
            "cargo:warning=the microVM guest init did not build (a static C library is needed: Debian libc6-dev); the microvm backend will be unavailable"
        );
        std::fs::write(&out, b"").unwrap();
    }
}
