//! A client of QEMU's machine protocol (QMP) for the few commands cordon
//! sends: blocking, over the socket QEMU was started with, each reply
//! awaited with a deadline. Replies are read as the closed types here;
//! events are skipped. QEMU is confined but runs the guest: a reply that
//! does not parse is an error, never guessed at.

use std::io::{BufRead, BufReader, IoSlice, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest line of QMP cordon reads: its replies are small, and a
/// line without end must not grow the host's memory.
const MAX_LINE: u64 = 64 << 10;

/// A command, as QMP spells it.
#[derive(Debug, Serialize)]
#[serde(tag = "execute", content = "arguments", rename_all = "kebab-case")]
pub(super) enum Command<'a> {
    #[serde(rename = "qmp_capabilities")]
    Capabilities,
    Stop,
    Cont,
    /// Takes the descriptor sent with it, under `fdname`.
    Getfd {
        fdname: &'a str,
    },
    /// `uri` is `fd:NAME` here: QEMU 7.2 has no `file:`, and its own
    /// sandbox forbids `exec:`.
    Migrate {
        uri: &'a str,
    },
    /// Loads the snapshot QEMU was told to wait for (`-incoming defer`)
    /// from `uri`.
    MigrateIncoming {
        uri: &'a str,
    },
    MigrateSetCapabilities {
        capabilities: &'a [CapabilityState],
    },
    QueryMigrate,
    QueryStatus,
}

/// A migration capability set on or off. QEMU 7.2 has no `-global` for
/// them: they are set over QMP, before a migration either way.
#[derive(Debug, Serialize)]
pub(super) struct CapabilityState {
    pub capability: Capability,
    pub state: bool,
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Capability {
    /// Leaves memory QEMU maps shared out of the stream: a snapshot's
    /// memory is a file of its own (see `ram`).
    XIgnoreShared,
}

/// `query-status`'s answer, the part cordon reads: the run state, such as
/// `running`, `paused`, `finish-migrate` or `postmigrate`.
#[derive(Debug, Deserialize)]
pub(super) struct StatusInfo {
    pub status: String,
}

/// One line from QEMU: the greeting, a reply or an event.
#[derive(Debug, Deserialize)]
struct Line {
    #[serde(rename = "return")]
    ret: Option<serde_json::Value>,
    error: Option<QmpError>,
    event: Option<String>,
    #[serde(rename = "QMP")]
    greeting: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
struct QmpError {
    class: String,
    desc: String,
}

/// `query-migrate`'s answer, the parts cordon reads.
#[derive(Debug, Deserialize)]
pub(super) struct MigrationInfo {
    pub status: Option<MigrationStatus>,
    #[serde(rename = "error-desc")]
    pub error_desc: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum MigrationStatus {
    Completed,
    Failed,
    Cancelled,
    /// Any of the states on the way (setup, active, device, ...).
    #[serde(other)]
    Running,
}

/// A QMP connection past its greeting and capabilities negotiation.
pub(super) struct Qmp {
    reader: BufReader<UnixStream>,
}

fn protocol(what: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!("QEMU's monitor: {what}")))
}

impl Qmp {
    /// Reads QEMU's greeting and enters command mode; every reply must
    /// come within `timeout`.
    pub(super) fn connect(stream: UnixStream, timeout: Duration) -> Result<Qmp> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
        };
        let greeting = qmp.line()?;
        if greeting.greeting.is_none() {
            return Err(protocol("no greeting"));
        }
        qmp.execute::<serde::de::IgnoredAny>(&Command::Capabilities, None)?;
        Ok(qmp)
    }

    /// Sends `command` (with `fd` as its ancillary descriptor, for
    /// `getfd`) and returns its reply's value.
    pub(super) fn execute<T: DeserializeOwned>(
        &mut self,
        command: &Command<'_>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<T> {
        let mut bytes = serde_json::to_vec(command).map_err(protocol)?;
        bytes.push(b'\n');
        let stream = self.reader.get_mut();
        match fd {
            None => stream.write_all(&bytes)?,
            Some(fd) => send_with_fd(stream, &bytes, fd)?,
        }
        loop {
            let line = self.line()?;
            if let Some(e) = line.error {
                return Err(protocol(format_args!(
                    "{command:?} failed: {} ({})",
                    e.desc, e.class
                )));
            }
            if let Some(ret) = line.ret {
                return serde_json::from_value(ret).map_err(protocol);
            }
            if line.event.is_none() {
                return Err(protocol("a line that is no reply"));
            }
        }
    }

    fn line(&mut self) -> Result<Line> {
        use std::io::Read;
        let mut text = String::new();
        let n = (&mut self.reader)
            .take(MAX_LINE)
            .read_line(&mut text)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    protocol("no answer in time")
                }
                _ => Error::Io(e),
            })?;
        if n == 0 {
            return Err(protocol("QEMU closed its monitor"));
        }
        if !text.ends_with('\n') {
            return Err(protocol("a line too long"));
        }
        serde_json::from_str(&text).map_err(protocol)
    }
}

/// Writes `bytes` with `fd` as SCM_RIGHTS, all in one message: QEMU takes
/// the descriptor with the command that names it.
fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(protocol("no room for a descriptor"));
    }
    let sent = sendmsg(
        stream.as_fd(),
        &[IoSlice::new(bytes)],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    )
    .map_err(std::io::Error::from)?;
    if sent != bytes.len() {
        // A command of a few dozen bytes goes whole into a socket's
        // buffer; anything else is a monitor not reading.
        return Err(protocol("a command sent in part"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_spelled_as_qmp_wants() {
        let json = |c: Command| serde_json::to_string(&c).unwrap();
        assert_eq!(json(Command::Stop), r#"{"execute":"stop"}"#);
        assert_eq!(
            json(Command::Capabilities),
            r#"{"execute":"qmp_capabilities"}"#
        );
        assert_eq!(
            json(Command::QueryMigrate),
            r#"{"execute":"query-migrate"}"#
        );
        assert_eq!(json(Command::QueryStatus), r#"{"execute":"query-status"}"#);
        assert_eq!(
            json(Command::Migrate { uri: "fd:snap" }),
            r#"{"execute":"migrate","arguments":{"uri":"fd:snap"}}"#
        );
        assert_eq!(
            json(Command::MigrateIncoming { uri: "fd:7" }),
            r#"{"execute":"migrate-incoming","arguments":{"uri":"fd:7"}}"#
        );
        assert_eq!(
            json(Command::MigrateSetCapabilities {
                capabilities: &[CapabilityState {
                    capability: Capability::XIgnoreShared,
                    state: true
                }]
            }),
            r#"{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"x-ignore-shared","state":true}]}}"#
        );
    }

    #[test]
    fn replies_events_and_errors() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let qemu = std::thread::spawn(move || {
            let mut theirs = BufReader::new(theirs);
            let mut w = theirs.get_ref().try_clone().unwrap();
            w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut l = String::new();
            theirs.read_line(&mut l).unwrap();
            assert!(l.contains("qmp_capabilities"));
            w.write_all(b"{\"return\": {}}\n").unwrap();
            l.clear();
            theirs.read_line(&mut l).unwrap();
            w.write_all(b"{\"event\": \"STOP\", \"timestamp\": {}}\n{\"return\": {\"status\": \"completed\"}}\n").unwrap();
            l.clear();
            theirs.read_line(&mut l).unwrap();
            w.write_all(b"{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}}\n")
                .unwrap();
            l.clear();
            theirs.read_line(&mut l).unwrap();
            w.write_all(&[b'x'; 70 << 10]).unwrap();
        });
        let mut qmp = Qmp::connect(ours, Duration::from_secs(5)).unwrap();
        let info: MigrationInfo = qmp.execute(&Command::QueryMigrate, None).unwrap();
        assert_eq!(info.status, Some(MigrationStatus::Completed));
        let err = qmp
            .execute::<serde::de::IgnoredAny>(&Command::Stop, None)
            .unwrap_err();
        assert!(err.to_string().contains("no (GenericError)"), "{err}");
        let err = qmp
            .execute::<serde::de::IgnoredAny>(&Command::Cont, None)
            .unwrap_err();
        assert!(err.to_string().contains("too long"), "{err}");
        qemu.join().unwrap();
    }
}
