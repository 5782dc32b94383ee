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

pub use install::{Lab, LabError, Versions, cache_dir, installed, setup};

/// Where a sandbox sees the environment.
pub const SANDBOX_DIR: &str = "/opt/cordon/jupyter";

/// The environment's Python inside a sandbox. Always run as `python -m`:
/// the scripts in its `bin/` name the host's path in their first line.
pub const SANDBOX_PYTHON: &str = "/opt/cordon/jupyter/bin/python";

/// The Python the environment is made from: the system's, which every
/// sandbox has at this same path (a user's own build, in a home directory
/// or `pyenv`, is not visible in a sandbox).
pub const HOST_PYTHON: &str = "/usr/bin/python3";

/// Binds the installed environment, if there is one, read-only into
/// sandboxes made from `config` at [`SANDBOX_DIR`]; whether it did. The
/// kernel behind `run_code` runs there.
pub fn offer(config: &mut cordon_sandbox::SandboxConfig) -> bool {
    let Some(lab) = installed(&cache_dir()) else {
        return false;
    };
    if !config.binds.iter().any(|b| b.target == SANDBOX_DIR) {
        config.binds.push(cordon_sandbox::BindMount {
            source: lab.dir,
            target: SANDBOX_DIR.to_string(),
            writable: false,
        });
    }
    true
}

/// What `cordon lab setup` installs, and the pins of everything it pulls in.
pub const REQUIREMENTS: &str = include_str!("../requirements.txt");
pub const CONSTRAINTS: &str = include_str!("../constraints.txt");
