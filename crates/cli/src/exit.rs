//! Exit codes of `cordon run` and `cordon shell` that are cordon's own,
//! in one place: every command that ends the process with one takes it
//! from here.

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

/// Every exit code that is cordon's own rather than the command's, with
/// its name and meaning: what `docs/reference/exit-codes.md` is made from.
pub const ALL: &[(i32, &str, &str)] = &[
    (
        CONFIG,
        "CONFIG",
        "the configuration is invalid (sysexits' EX_CONFIG)",
    ),
    (
        OOM,
        "OOM",
        "the sandbox exceeded its memory limit and the kernel killed a process",
    ),
    (
        DISK,
        "DISK",
        "the workspace outgrew the disk budget and the sandbox was stopped",
    ),
    (
        TIMEOUT,
        "TIMEOUT",
        "the command ran past its timeout and was killed",
    ),
    (
        SANDBOX,
        "SANDBOX",
        "cordon itself failed: bad options, or the sandbox could not be created",
    ),
    (
        NOT_EXECUTABLE,
        "NOT_EXECUTABLE",
        "the command exists but could not be executed",
    ),
    (NOT_FOUND, "NOT_FOUND", "the command was not found"),
];

/// The exit status of `cordon run` and `cordon shell`, for their `--help`.
pub fn status_help() -> String {
    let mut help = String::from(
        "Exit status: the command's own (128+N if killed by signal N), or one of cordon's:\n",
    );
    for (code, _, meaning) in ALL {
        help.push_str(&format!("  {code:>3}  {meaning}\n"));
    }
    help
}
