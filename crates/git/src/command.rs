//! Running the `git` program so that nothing it reads can make it run
//! another one.
//!
//! Git runs programs named by its configuration (hooks, `core.fsmonitor`,
//! filter, diff and merge drivers, `core.sshCommand`, credential helpers,
//! `ext::` transports, pagers, editors), and it reads configuration from
//! the system, the user, the repository and the environment. cordon's
//! host-side git takes none of it from anywhere but this module: the
//! environment is built from nothing, system and global configuration are
//! off, and every setting that names a program is overridden on the
//! command line, which git reads last. That holds even for a repository
//! whose own configuration was written by the sandbox; `repo.rs` refuses
//! such a repository before git is pointed at it, and this is the second
//! guard.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Settings given to every git command, overriding whatever a repository's
/// configuration says. Each names a program git would otherwise run, or a
/// file it would otherwise read from the user's home.
const SAFE_SETTINGS: &[(&str, &str)] = &[
    // No hooks: a directory that holds none.
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    // The user's attributes and excludes (`~/.config/git/…`) name drivers
    // and change what is read; cordon's git takes neither.
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.symlinks", "true"),
    // An empty value empties the list of helpers read so far.
    ("credential.helper", ""),
    // Transports: none unless a command allows one (`Git::allow_protocol`);
    // `ext::` runs a command and is never allowed.
    ("protocol.allow", "never"),
    ("protocol.ext.allow", "never"),
    ("init.templateDir", ""),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("push.recurseSubmodules", "no"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("transfer.fsckObjects", "true"),
    ("safe.directory", "*"),
];

/// What went wrong running git.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot run git ({program}): {source}; install git on the host")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    /// Git ran and failed; `stderr` is made printable.
    #[error("git {command} failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("git {command}: {source}")]
    Io {
        command: String,
        source: std::io::Error,
    },
    #[error("git {command} said something cordon does not understand: {what}")]
    Unexpected { command: String, what: String },
}

/// One repository, and how git is run on it.
#[derive(Debug, Clone)]
pub struct Git {
    program: PathBuf,
    git_dir: PathBuf,
    /// No repository yet (a clone): commands run in `git_dir`'s parent,
    /// with no `GIT_DIR`.
    outside: bool,
    work_tree: Option<PathBuf>,
    protocols: Vec<&'static str>,
    env: Vec<(OsString, OsString)>,
    /// Settings after [`SAFE_SETTINGS`] (the host's credential helpers).
    settings: Vec<String>,
}

impl Git {
    /// Git on the repository `git_dir` (a bare one, or the `.git` of a
    /// work tree given with [`Git::work_tree`]).
    pub fn new(git_dir: impl Into<PathBuf>) -> Git {
        Git {
            program: PathBuf::from("git"),
            git_dir: git_dir.into(),
            outside: false,
            work_tree: None,
            protocols: Vec::new(),
            env: Vec::new(),
            settings: Vec::new(),
        }
    }

    /// Git with no repository, run in `dir` (for `git clone`).
    pub fn outside(dir: impl Into<PathBuf>) -> Git {
        Git {
            outside: true,
            ..Git::new(dir)
        }
    }

    /// A setting given after the safe ones (`credential.helper=...`): only
    /// for values cordon chose or took from the host's own configuration.
    pub(crate) fn setting(mut self, key: &str, value: &str) -> Git {
        self.settings.push(format!("{key}={value}"));
        self
    }

    pub fn git_dir(&self) -> &Path {
        &self.git_dir
    }

    /// Commands see `dir` as their work tree. Only ones that read it as a
    /// whole are given one (a status, a diff): cordon itself reads and
    /// writes a workspace's files, beneath it and never through a link.
    pub fn work_tree(mut self, dir: impl Into<PathBuf>) -> Git {
        self.work_tree = Some(dir.into());
        self
    }

    /// Lets commands use the transport `name` (`https`, `ssh`, `git`,
    /// `file`); `ext` stays refused.
    pub fn allow_protocol(mut self, name: &'static str) -> Git {
        assert_ne!(name, "ext", "the ext transport runs commands");
        self.protocols.push(name);
        self
    }

    /// An environment variable for every command (an author, an SSH agent).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Git {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The command line and environment of `git ARGS`, nothing inherited
    /// but `PATH` (to find git and what it runs of its own).
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new(&self.program);
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ATTR_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_PAGER", "cat")
            .env("GIT_EDITOR", "false")
            .env("GIT_SSH_COMMAND", "false");
        if self.outside {
            // Nothing above may be taken for a repository.
            cmd.current_dir(&self.git_dir)
                .env("GIT_CEILING_DIRECTORIES", &self.git_dir);
        } else {
            cmd.env("GIT_DIR", &self.git_dir);
            match &self.work_tree {
                Some(w) => cmd.env("GIT_WORK_TREE", w).current_dir(w),
                None => cmd.current_dir(&self.git_dir),
            };
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (key, value) in SAFE_SETTINGS {
            cmd.arg("-c").arg(format!("{key}={value}"));
        }
        for p in &self.protocols {
            cmd.arg("-c").arg(format!("protocol.{p}.allow=always"));
        }
        for s in &self.settings {
            cmd.arg("-c").arg(s);
        }
        let mut args = args.into_iter();
        if let Some(sub) = args.next() {
            let sub = sub.as_ref();
            cmd.arg(sub);
            // `diff.external` and textconv drivers name programs; an empty
            // setting would not turn them off, only break the diff.
            if ["diff", "log", "show"].iter().any(|d| sub == *d) {
                cmd.args(["--no-ext-diff", "--no-textconv"]);
            }
        }
        cmd.args(args);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Runs `git ARGS` and returns what it printed.
    pub fn run<I, S>(&self, args: I) -> Result<Vec<u8>, GitError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.run_with(args, None)
    }

    /// Runs `git ARGS` with `input` on its standard input.
    pub fn run_with<I, S>(&self, args: I, input: Option<&[u8]>) -> Result<Vec<u8>, GitError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = self.command(args);
        let name = describe(&cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = self.spawn(&mut cmd)?;
        if let Some(input) = input {
            let mut stdin = child.stdin.take().expect("piped");
            // A writer thread: git may fill its output pipe before it has
            // read all of its input.
            let input = input.to_vec();
            let writer = std::thread::spawn(move || stdin.write_all(&input));
            let out = child.wait_with_output();
            let _ = writer.join();
            return finish(&name, out);
        }
        finish(&name, child.wait_with_output())
    }

    /// Starts `cmd` (from [`Git::command`]).
    pub fn spawn(&self, cmd: &mut Command) -> Result<Child, GitError> {
        cmd.spawn().map_err(|source| GitError::Spawn {
            program: self.program.display().to_string(),
            source,
        })
    }
}

/// The sub-command of `cmd`, for messages: the first argument after the
/// `-c` settings.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut args = cmd.get_args().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = args.next() {
        if a == "-c" {
            args.next();
            continue;
        }
        return a;
    }
    String::from("(nothing)")
}

pub(crate) fn finish(
    command: &str,
    out: std::io::Result<std::process::Output>,
) -> Result<Vec<u8>, GitError> {
    let out = out.map_err(|source| GitError::Io {
        command: command.to_string(),
        source,
    })?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    Err(GitError::Failed {
        command: command.to_string(),
        stderr: shown_stderr(&out.stderr),
    })
}

/// Git's complaint, which can quote the workspace's file names, fit to
/// print: control characters escaped, and only the last few lines.
pub(crate) fn shown_stderr(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(8)..];
    let text = cordon_tools::printable(&tail.join(" / "));
    if text.is_empty() {
        String::from("(no message)")
    } else {
        text
    }
}
