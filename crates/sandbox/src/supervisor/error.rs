//! How a setup step fails: what it was doing and the errno, which the host
//! turns into a one-line message.

use rustix::io::Errno;

/// A setup step that failed.
#[derive(Debug)]
pub struct SetupError {
    pub what: String,
    pub errno: i32,
}

impl From<SetupError> for crate::error::Error {
    fn from(e: SetupError) -> crate::error::Error {
        crate::error::Error::Setup {
            message: e.message(),
            errno: e.errno,
        }
    }
}

impl SetupError {
    pub fn new(what: impl Into<String>, errno: Errno) -> Self {
        SetupError {
            what: what.into(),
            errno: errno.raw_os_error(),
        }
    }

    pub(crate) fn io(what: impl Into<String>, err: std::io::Error) -> Self {
        SetupError {
            what: what.into(),
            errno: err.raw_os_error().unwrap_or(0),
        }
    }

    pub fn message(&self) -> String {
        if self.errno == 0 {
            self.what.clone()
        } else {
            format!(
                "{}: {}",
                self.what,
                std::io::Error::from_raw_os_error(self.errno)
            )
        }
    }
}

pub(super) type Result<T> = std::result::Result<T, SetupError>;

pub(super) trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for rustix::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| SetupError::new(what(), e))
    }
}

impl<T> Context<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| SetupError::io(what(), e))
    }
}
