//! The environment in the cache: `<cache>/<lock id>/`, a virtual
//! environment with a marker written last, made under a lock so two
//! setups at once build it once.

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{CONSTRAINTS, HOST_PYTHON, REQUIREMENTS};
use serde::{Deserialize, Serialize};

/// Marks a complete environment, written last; holds its [`Versions`].
const MARKER: &str = ".cordon-lab.json";

/// What went wrong setting the environment up, said so the user can act.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "cordon lab needs the system's Python at {HOST_PYTHON} with its venv module \
         (Debian: apt-get install python3 python3-venv)"
    )]
    NoPython,
    #[error("{step} failed ({status}); its last lines:\n{tail}")]
    Step {
        step: &'static str,
        status: String,
        tail: String,
    },
    #[error("the environment was made but does not import: {0}")]
    Broken(String),
}

trait At<T> {
    fn at(self, path: &Path) -> Result<T, LabError>;
}

impl<T> At<T> for io::Result<T> {
    fn at(self, path: &Path) -> Result<T, LabError> {
        self.map_err(|source| LabError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// The versions an environment holds, as its own Python reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Versions {
    pub python: String,
    pub jupyterlab: String,
    pub ipykernel: String,
    pub jupyter_client: String,
}

/// A complete environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lab {
    /// The environment's root on the host (what sandboxes mount).
    pub dir: PathBuf,
    pub versions: Versions,
}

/// Where the environment is kept: `$CORDON_LAB_DIR`, else
/// `/var/cache/cordon/lab` for root, else `$XDG_CACHE_HOME/cordon/lab`
/// (`~/.cache/cordon/lab`).
pub fn cache_dir() -> PathBuf {
    cordon_sandbox::cache_dir("lab", "CORDON_LAB_DIR")
}

/// The pins' fingerprint: a new pin is a new environment. Hashed by the
/// build script (build.rs) from the same files and Python.
fn lock_id() -> &'static str {
    env!("CORDON_LAB_LOCK_ID")
}

/// The complete environment for these pins in `cache`, if there is one.
pub fn installed(cache: &Path) -> Option<Lab> {
    let dir = cache.join(lock_id());
    let marker = fs::read(dir.join(MARKER)).ok()?;
    let versions = serde_json::from_slice(&marker).ok()?;
    Some(Lab { dir, versions })
}

/// Makes the environment for these pins in `cache` unless it is there,
/// saying what it does through `progress` (pip's own lines among them);
/// removes environments of other pins.
pub fn setup(cache: &Path, progress: &mut dyn FnMut(&str)) -> Result<Lab, LabError> {
    if !Path::new(HOST_PYTHON).is_file() {
        return Err(LabError::NoPython);
    }
    make_dir(cache)?;
    let _lock = lock(cache)?;
    if let Some(lab) = installed(cache) {
        progress(&format!("already set up in {}", lab.dir.display()));
        return Ok(lab);
    }
    let dir = cache.join(lock_id());
    // A setup that stopped half-way left no marker: start again.
    if dir.exists() {
        fs::remove_dir_all(&dir).at(&dir)?;
    }
    // pip and venv run in a directory of their own, never the caller's.
    let work = cache.join(format!("{}.work", lock_id()));
    if work.exists() {
        fs::remove_dir_all(&work).at(&work)?;
    }
    make_dir(&work)?;
    let requirements = work.join("requirements.txt");
    let constraints = work.join("constraints.txt");
    fs::write(&requirements, REQUIREMENTS).at(&requirements)?;
    fs::write(&constraints, CONSTRAINTS).at(&constraints)?;

    progress(&format!(
        "making a virtual environment in {}",
        dir.display()
    ));
    run(
        "python3 -m venv",
        Command::new(HOST_PYTHON)
            .args(["-I", "-m", "venv", "--system-site-packages"])
            .arg(&dir),
        &work,
        progress,
    )?;
    let python = dir.join("bin/python");
    progress("installing the pinned packages with pip");
    run(
        "pip install",
        Command::new(&python)
            .args(["-I", "-m", "pip", "install", "--no-input"])
            .args(["--disable-pip-version-check", "--progress-bar", "off"])
            .arg("-r")
            .arg(&requirements)
            .arg("-c")
            .arg(&constraints),
        &work,
        progress,
    )?;
    let versions = versions(&python, &work)?;
    let marker = dir.join(MARKER);
    let json = serde_json::to_vec_pretty(&versions).expect("strings serialize");
    fs::write(&marker, json).at(&marker)?;
    fs::remove_dir_all(&work).at(&work)?;
    prune(cache, &dir);
    progress(&format!(
        "ready: JupyterLab {}, ipykernel {}, jupyter_client {} on Python {}",
        versions.jupyterlab, versions.ipykernel, versions.jupyter_client, versions.python
    ));
    Ok(Lab { dir, versions })
}

/// Creates `dir` readable by everyone: sandboxes read the environment as
/// whatever user they map to.
fn make_dir(dir: &Path) -> Result<(), LabError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .at(dir)
}

/// Holds the cache's lock until dropped.
fn lock(cache: &Path) -> Result<fs::File, LabError> {
    let path = cache.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .at(&path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(io::Error::from)
        .at(&path)?;
    Ok(file)
}

/// Lines of a failed step kept for its error.
const TAIL_LINES: usize = 15;

/// Runs one step in `work`, its output line by line to `progress`.
fn run(
    step: &'static str,
    cmd: &mut Command,
    work: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), LabError> {
    let mut child = cmd
        .current_dir(work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // One stream, in order: pip's errors come among its lines.
        .stderr(Stdio::piped())
        .spawn()
        .at(work)?;
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut tail = std::collections::VecDeque::new();
    for line in BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        if !noise(&line) {
            progress(&format!("  {line}"));
        }
        tail.push_back(line);
        if tail.len() > TAIL_LINES {
            tail.pop_front();
        }
    }
    let status = child.wait().at(work)?;
    let errors = errors.join().unwrap_or_default();
    for line in errors.iter().filter(|l| !noise(l)) {
        progress(&format!("  {line}"));
    }
    if status.success() {
        return Ok(());
    }
    tail.extend(errors);
    let skip = tail.len().saturating_sub(TAIL_LINES);
    Err(LabError::Step {
        step,
        status: status.to_string(),
        tail: tail.into_iter().skip(skip).collect::<Vec<_>>().join("\n"),
    })
}

/// pip's lines about the system's copy of a package it installs over in
/// the environment (`--system-site-packages`): it cannot uninstall the
/// system's, need not, and says so, which reads like a failure. Kept for
/// a failed step's error, not shown as progress.
fn noise(line: &str) -> bool {
    let line = line.trim_start();
    [
        "Attempting uninstall: ",
        "Found existing installation: ",
        "Not uninstalling ",
        "Can't uninstall '",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// Asks the environment's Python what it holds.
fn versions(python: &Path, work: &Path) -> Result<Versions, LabError> {
    const PROBE: &str = "import json, platform\n\
        from importlib.metadata import version\n\
        print(json.dumps({'python': platform.python_version(),\n\
          'jupyterlab': version('jupyterlab'), 'ipykernel': version('ipykernel'),\n\
          'jupyter_client': version('jupyter_client')}))\n\
        import ipykernel.kernelapp, jupyter_client, jupyterlab\n";
    let out = Command::new(python)
        .args(["-I", "-c", PROBE])
        .current_dir(work)
        .stdin(Stdio::null())
        .output()
        .at(python)?;
    if !out.status.success() {
        return Err(LabError::Broken(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| LabError::Broken(e.to_string()))
}

/// Removes the environments of other pins (names of 16 hex digits).
fn prune(cache: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        let ours = name.len() == 16 && name.chars().all(|c| c.is_ascii_hexdigit());
        if ours
            && path != keep
            && e.file_type().is_ok_and(|t| t.is_dir())
            && let Err(err) = fs::remove_dir_all(&path)
        {
            tracing::warn!("cannot remove {}: {err}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_requirement_is_pinned_and_constrained() {
        let pins: Vec<&str> = CONSTRAINTS
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect();
        assert!(pins.len() > 50, "{pins:?}");
        assert!(
            pins.iter().all(|p| p.split_once("==").is_some()),
            "{pins:?}"
        );
        for req in REQUIREMENTS
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            assert!(req.contains("=="), "{req} is not pinned");
            assert!(pins.contains(&req), "{req} is not in constraints.txt");
        }
    }

    #[test]
    fn the_lock_id_is_the_hash_of_the_pins_and_the_python() {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(REQUIREMENTS)
            .chain_update([0u8])
            .chain_update(CONSTRAINTS)
            .chain_update([0u8])
            .chain_update(HOST_PYTHON)
            .finalize();
        let id: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        assert_eq!(lock_id(), id);
    }

    #[test]
    fn an_unfinished_environment_is_not_installed() {
        let cache = tempfile::tempdir().unwrap();
        let dir = cache.path().join(lock_id());
        fs::create_dir_all(dir.join("bin")).unwrap();
        assert_eq!(installed(cache.path()), None);
        fs::write(dir.join(MARKER), "{not json").unwrap();
        assert_eq!(installed(cache.path()), None);
        let v = Versions {
            python: "3.11.2".into(),
            jupyterlab: "4.6.6".into(),
            ipykernel: "7.4.0".into(),
            jupyter_client: "8.10.0".into(),
        };
        fs::write(dir.join(MARKER), serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(installed(cache.path()).unwrap().versions, v);
    }
}

#[cfg(test)]
mod noise_tests {
    #[test]
    fn pips_words_on_the_systems_copies_are_not_progress() {
        for line in [
            "  Attempting uninstall: packaging",
            "    Found existing installation: packaging 24.0",
            "    Not uninstalling packaging at /usr/lib/python3/dist-packages, outside environment /x",
            "    Can't uninstall 'packaging'. No files were found to uninstall.",
        ] {
            assert!(super::noise(line), "{line}");
        }
        assert!(!super::noise("Successfully installed jupyterlab-4.2.5"));
        assert!(!super::noise("ERROR: Could not find a version"));
    }
}
