//! The id maps of a user namespace: one id each way, and their one writer,
//! for the sandbox's own namespace and for the helpers' (see counts.rs and
//! idmap.rs).

use std::fs;

use super::error::{Context, Result};
use crate::protocol::SetupSpec;

/// One id each way for a user namespace: (inside, outside), uid and gid.
pub(crate) struct IdMaps {
    pub uid: (u32, u32),
    pub gid: (u32, u32),
}

impl IdMaps {
    /// The caller's ids, as the spec maps them.
    pub fn of(spec: &SetupSpec) -> IdMaps {
        IdMaps {
            uid: (spec.inner_uid, spec.outer_uid),
            gid: (spec.inner_gid, spec.outer_gid),
        }
    }
}

/// Writes the id maps of the user namespace of the process whose `/proc`
/// directory is `proc` (`/proc/self`, or `/proc/PID` of a child namespace).
pub(crate) fn write_maps(proc: &str, ids: &IdMaps) -> Result<()> {
    // Must precede gid_map for unprivileged callers; harmless for root.
    fs::write(format!("{proc}/setgroups"), "deny").ctx(|| "deny setgroups".into())?;
    fs::write(
        format!("{proc}/uid_map"),
        format!("{} {} 1\n", ids.uid.0, ids.uid.1),
    )
    .ctx(|| "write uid_map".into())?;
    fs::write(
        format!("{proc}/gid_map"),
        format!("{} {} 1\n", ids.gid.0, ids.gid.1),
    )
    .ctx(|| "write gid_map".into())
}

/// Writes the uid/gid maps of the user namespace this process just entered.
pub fn write_id_maps(spec: &SetupSpec) -> Result<()> {
    write_maps("/proc/self", &IdMaps::of(spec))
}
