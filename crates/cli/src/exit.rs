//! Exit codes that are cordon's own rather than the command's, in one
//! place: every command that ends the process with one takes it from here,
//! and `--help` and `docs/reference/exit-codes.md` are made from [`ALL`].

// The limits' codes are the sandbox crate's, shared with `cordon serve`.
pub use cordon_sandbox::exit_code::{DISK, OOM, TIMEOUT};
/// cordon itself failed: bad options, or the sandbox could not be created.
pub const SANDBOX: i32 = 125;
/// The command exists but could not be executed.
pub const NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;
/// The configuration is invalid (sysexits' EX_CONFIG).
pub const CONFIG: i32 = 78;
/// `cordon exec`: the model could not finish the task.
pub const MODEL_ERROR: i32 = 1;
/// `cordon exec`: interrupted before the task was done.
pub const INTERRUPTED: i32 = 130;

/// Which commands end with a code.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Used {
    /// `cordon run` and `cordon shell`, whose other codes are the command's.
    Run,
    /// `cordon exec`.
    Exec,
    Both,
}

impl Used {
    fn by(self, command: Used) -> bool {
        self == Used::Both || self == command
    }
}

/// One of cordon's exit codes.
pub struct Code {
    pub code: i32,
    pub meaning: &'static str,
    pub used: Used,
}

const fn code(code: i32, used: Used, meaning: &'static str) -> Code {
    Code {
        code,
        meaning,
        used,
    }
}

/// Every exit code that is cordon's own, in numeric order.
pub const ALL: &[Code] = &[
    code(
        MODEL_ERROR,
        Used::Exec,
        "the model could not finish the task: an API error, the step limit, a refusal, or its answer could not be written",
    ),
    code(
        CONFIG,
        Used::Both,
        "the configuration is invalid (sysexits' EX_CONFIG)",
    ),
    code(
        OOM,
        Used::Run,
        "the sandbox exceeded its memory limit and the kernel killed a process",
    ),
    code(
        DISK,
        Used::Both,
        "the workspace outgrew the disk budget and the sandbox was stopped",
    ),
    code(
        TIMEOUT,
        Used::Run,
        "the command ran past its timeout and was killed",
    ),
    code(
        SANDBOX,
        Used::Both,
        "cordon itself failed: bad options, or the sandbox could not be created",
    ),
    code(
        NOT_EXECUTABLE,
        Used::Run,
        "the command exists but could not be executed",
    ),
    code(NOT_FOUND, Used::Run, "the command was not found"),
    code(
        INTERRUPTED,
        Used::Exec,
        "interrupted before the task was done",
    ),
];

/// The exit status of `cordon run` and `cordon shell`, for their `--help`.
pub fn run_help() -> String {
    status_help(
        "Exit status: the command's own (128+N if killed by signal N), or one of cordon's:\n",
        Used::Run,
    )
}

/// The exit status of `cordon exec`, for its `--help`.
pub fn exec_help() -> String {
    status_help("Exit status: 0 when the task is done, or:\n", Used::Exec)
}

fn status_help(first: &str, command: Used) -> String {
    let mut help = String::from(first);
    for c in ALL.iter().filter(|c| c.used.by(command)) {
        help.push_str(&format!("  {:>3}  {}\n", c.code, c.meaning));
    }
    help
}
