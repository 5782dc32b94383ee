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
