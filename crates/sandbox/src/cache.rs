//! Where cordon keeps what it downloads and builds for sandboxes (the
//! microvm's guest kernel, the lab environment): one directory per kind.

use std::ffi::OsString;
use std::path::PathBuf;

/// `$<override_var>`, else `/var/cache/cordon/<name>` for root, else
/// `$XDG_CACHE_HOME/cordon/<name>` (`~/.cache/cordon/<name>`).
pub fn cache_dir(name: &str, override_var: &str) -> PathBuf {
    cache_dir_from(
        name,
        std::env::var_os(override_var),
        rustix::process::geteuid().is_root(),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn cache_dir_from(
    name: &str,
    explicit: Option<OsString>,
    root: bool,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    if let Some(dir) = explicit.filter(|d| !d.is_empty()) {
        return dir.into();
    }
    if root {
        return PathBuf::from("/var/cache/cordon").join(name);
    }
    // The XDG spec says to ignore relative paths in these variables.
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    match absolute(xdg).or_else(|| absolute(home).map(|h| h.join(".cache"))) {
        Some(base) => base.join("cordon").join(name),
        // A service account without a home: per user, and still kept
        // between runs.
        None => std::env::temp_dir().join(format!(
            "cordon-{name}-{}",
            rustix::process::getuid().as_raw()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_follows_the_environment() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            cache_dir_from("vm", s("/x/vm"), true, None, None),
            PathBuf::from("/x/vm")
        );
        assert_eq!(
            cache_dir_from("vm", s(""), true, None, None),
            PathBuf::from("/var/cache/cordon/vm")
        );
        assert_eq!(
            cache_dir_from("lab", None, false, s("/xdg"), s("/home/u")),
            PathBuf::from("/xdg/cordon/lab")
        );
        assert_eq!(
            cache_dir_from("vm", None, false, s("relative"), s("/home/u")),
            PathBuf::from("/home/u/.cache/cordon/vm")
        );
    }
}
