//! JupyterLab and the Python kernel for sandboxes. `cordon lab setup`
//! makes a virtual environment of the pinned packages (`requirements.txt`,
//! every dependency pinned by `constraints.txt`) in cordon's cache; every
//! sandbox that uses it gets it read-only at [`SANDBOX_DIR`].
//!
//! The environment is built on the host by the system's Python
//! ([`HOST_PYTHON`], which sandboxes see at the same path) in isolated mode
//! (`-I`: no `PYTHON*` variables, no current directory on `sys.path`) and
//! from an empty directory of its own, so nothing where `cordon` is run
//! (a workspace is the sandbox's to write) takes part. Nothing is installed
//! into the system's Python.

mod install;
pub mod jupyter;
pub mod proxy;
pub mod site;

pub use install::{Lab, LabError, Versions, cache_dir, installed, setup};
pub use jupyter::{SOCKET, StartError, start};
pub use proxy::Upstream;
pub use site::{Bearer, BearerCheck, Forward, Forwarding, Gate, Site, SiteOptions};

/// Where a sandbox sees the environment.
pub const SANDBOX_DIR: &str = "/opt/cordon/jupyter";

/// The environment's Python inside a sandbox. Always run as `python -m`:
/// the scripts in its `bin/` name the host's path in their first line.
pub const SANDBOX_PYTHON: &str = "/opt/cordon/jupyter/bin/python";

/// The Python the environment is made from: the system's, which every
/// sandbox has at this same path (a user's own build, in a home directory
/// or `pyenv`, is not visible in a sandbox).
pub const HOST_PYTHON: &str = env!("CORDON_LAB_HOST_PYTHON");

/// Binds the installed environment, if there is one, read-only into
/// sandboxes made from `config` at [`SANDBOX_DIR`]; whether it did. The
/// kernel behind `run_code` runs there. Call it after the user's own
/// binds: one at, above or beneath [`SANDBOX_DIR`] wins, and the
/// environment is left out.
pub fn offer(config: &mut cordon_sandbox::SandboxConfig) -> bool {
    // The environment is built on the host's Python; an image has its own
    // (or none), which run_code then uses as it is.
    if config.image.is_some() {
        return false;
    }
    match installed(&cache_dir()) {
        Some(lab) => bind_into(config, lab.dir),
        None => false,
    }
}

fn bind_into(config: &mut cordon_sandbox::SandboxConfig, dir: std::path::PathBuf) -> bool {
    let overlaps = |target: &str| {
        let t = target.trim_end_matches('/');
        t == SANDBOX_DIR
            || t.is_empty()
            || SANDBOX_DIR.starts_with(&format!("{t}/"))
            || t.starts_with(&format!("{SANDBOX_DIR}/"))
    };
    if config.binds.iter().any(|b| overlaps(&b.target)) {
        return config.binds.iter().any(|b| {
            b.target.trim_end_matches('/') == SANDBOX_DIR && b.source == dir && !b.writable
        });
    }
    config.binds.push(cordon_sandbox::BindMount {
        source: dir,
        target: SANDBOX_DIR.to_string(),
        writable: false,
    });
    true
}

/// What `cordon lab setup` installs, and the pins of everything it pulls in.
pub const REQUIREMENTS: &str = include_str!("../requirements.txt");
pub const CONSTRAINTS: &str = include_str!("../constraints.txt");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_bind_at_above_or_beneath_the_place_wins() {
        let dir = std::path::PathBuf::from("/cache/lab/env");
        let with = |targets: &[&str]| {
            let mut c = cordon_sandbox::SandboxConfig::new("/w");
            for t in targets {
                c.binds.push(cordon_sandbox::BindMount {
                    source: "/host/x".into(),
                    target: t.to_string(),
                    writable: false,
                });
            }
            let offered = bind_into(&mut c, dir.clone());
            (offered, c.binds.len())
        };
        assert_eq!(with(&[]), (true, 1));
        assert_eq!(with(&["/opt/other", "/opt/cordonx"]), (true, 3));
        for taken in [
            "/opt/cordon",
            "/opt/cordon/",
            "/opt",
            "/",
            "/opt/cordon/jupyter",
            "/opt/cordon/jupyter/lib",
        ] {
            assert_eq!(with(&[taken]), (false, 1), "{taken}");
        }
        // Offered twice: bound once.
        let mut c = cordon_sandbox::SandboxConfig::new("/w");
        assert!(bind_into(&mut c, dir.clone()));
        assert!(bind_into(&mut c, dir));
        assert_eq!(c.binds.len(), 1);
    }
}

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &["install", "jupyter", "site", "proxy"];

#[cfg(test)]
mod layout;
