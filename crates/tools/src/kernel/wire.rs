//! The JSON lines between the host and the bridge (`bridge.py`): one
//! [`Request`] per line to its stdin, [`Reply`] lines from its stdout, each
//! request ending in exactly one [`Reply::Done`] with the request's id.
//!
//! Replies come from inside the sandbox, so they are closed types: a line
//! that is not exactly one of them is dropped.

use serde::{Deserialize, Serialize};

/// The protocol version the bridge announces in [`Reply::Ready`].
pub const PROTOCOL: u32 = 1;

/// What the host asks of the bridge.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Run `code` in the kernel; past `timeout` seconds, interrupt it.
    Execute { id: u64, code: String, timeout: f64 },
    /// Restart the kernel (its state is lost), or start it if it died.
    Restart { id: u64 },
}

/// What the bridge says.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The kernel is up and takes requests.
    Ready { protocol: u32 },
    /// The bridge could not start the kernel and exits.
    Fatal { message: String },
    /// Text the code printed.
    Stream {
        id: u64,
        name: cordon_sandbox::Stream,
        text: String,
    },
    /// `display(...)` output.
    Display { id: u64, data: MimeBundle },
    /// The value of the cell's last expression.
    Result { id: u64, data: MimeBundle },
    /// An exception, its traceback free of ANSI escapes.
    Error {
        id: u64,
        ename: String,
        evalue: String,
        traceback: Vec<String>,
    },
    /// The request is over.
    Done {
        id: u64,
        status: Status,
        execution_count: Option<u64>,
        /// Output bytes the bridge did not forward (over its per-call cap).
        dropped_stream_bytes: u64,
        /// Display items the bridge did not forward.
        dropped_display_items: u64,
    },
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The code ran to its end.
    Ok,
    /// The code raised.
    Error,
    /// The kernel skipped the code.
    Aborted,
    /// Past the timeout; the kernel was interrupted and kept its state.
    Timeout,
    /// Past the timeout, the kernel ignored the interrupt and was restarted.
    TimeoutRestarted,
    /// The kernel process is gone.
    Dead,
    /// A restart request succeeded.
    Restarted,
}

/// The MIME types the bridge forwards; it leaves out all others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MimeBundle {
    /// Base64.
    #[serde(rename = "image/png")]
    pub png: Option<String>,
    /// Base64.
    #[serde(rename = "image/jpeg")]
    pub jpeg: Option<String>,
    #[serde(rename = "image/svg+xml")]
    pub svg: Option<String>,
    #[serde(rename = "text/html")]
    pub html: Option<String>,
    #[serde(rename = "text/plain")]
    pub plain: Option<String>,
}

impl MimeBundle {
    /// Characters of data held.
    pub fn size(&self) -> usize {
        [&self.png, &self.jpeg, &self.svg, &self.html, &self.plain]
            .iter()
            .map(|v| v.as_ref().map_or(0, String::len))
            .sum()
    }
}
