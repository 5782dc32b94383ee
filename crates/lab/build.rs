//! The environment's lock id, the fingerprint of its pins: hashed here,
//! once, rather than at every start of `cordon`, which looks for the
//! environment each time it makes a sandbox (the hash was a twentieth of a
//! cold `cordon run`'s instructions).

use sha2::{Digest, Sha256};

/// The Python the environment is made from (the crate's `HOST_PYTHON`,
/// which takes its value from here so that the two cannot differ).
const HOST_PYTHON: &str = "/usr/bin/python3";

fn main() {
    let read = |file: &str| {
        println!("cargo:rerun-if-changed={file}");
        std::fs::read(file).unwrap_or_else(|e| panic!("read {file}: {e}"))
    };
    let digest = Sha256::new()
        .chain_update(read("requirements.txt"))
        .chain_update([0u8])
        .chain_update(read("constraints.txt"))
        .chain_update([0u8])
        .chain_update(HOST_PYTHON)
        .finalize();
    let id: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=CORDON_LAB_LOCK_ID={id}");
    println!("cargo:rustc-env=CORDON_LAB_HOST_PYTHON={HOST_PYTHON}");
}
