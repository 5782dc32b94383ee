//! How host-side git reaches a remote: with the host user's own means (the
//! credential helpers of their git configuration, their SSH agent), or, for
//! someone else (a tenant of `cordon serve`), with a login given for that
//! one host and nothing of the host's.
//!
//! Either way the secrets go to the git commands that talk to the remote
//! and nowhere else: never into a repository's configuration, a file or a
//! command line (a process's arguments are readable by every user of the
//! machine; its environment only by its own).

use std::ffi::OsString;
use std::net::IpAddr;

use crate::command::Git;

/// A remote reached over HTTP(S): its scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `https` or `http`.
    pub scheme: &'static str,
    /// Lower case; an IPv6 address without its brackets.
    pub host: String,
    pub port: u16,
    /// Whether the URL named the port.
    explicit_port: bool,
}

impl Endpoint {
    /// The endpoint of an `https://` or `http://` URL; `None` for any
    /// other URL, or one whose host or port cannot be read.
    pub fn of_url(url: &str) -> Option<Endpoint> {
        let (scheme, rest) = url.split_once("://")?;
        let (scheme, default_port) = match scheme.to_ascii_lowercase().as_str() {
            "https" => ("https", 443),
            "http" => ("http", 80),
            _ => return None,
        };
        let authority = rest.split(['/', '?', '#']).next()?;
        let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (addr, after) = v6.split_once(']')?;
            addr.parse::<std::net::Ipv6Addr>().ok()?;
            (addr.to_string(), after.strip_prefix(':'))
        } else {
            match authority.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let host = host.to_ascii_lowercase();
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c));
        if !host_ok || host.starts_with(['.', '-']) {
            return None;
        }
        let port = match port {
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return None,
            },
            None => None,
        };
        Some(Endpoint {
            scheme,
            host,
            port: port.unwrap_or(default_port),
            explicit_port: port.is_some(),
        })
    }

    /// How credentials for it are filed: `host`, or `host:port` when the
    /// URL names a port.
    pub fn key(&self) -> String {
        match (self.explicit_port, self.ip()) {
            (true, Some(IpAddr::V6(_))) => format!("[{}]:{}", self.host, self.port),
            (true, _) => format!("{}:{}", self.host, self.port),
            (false, _) => self.host.clone(),
        }
    }

    /// `scheme://host[:port]`, as git's `credential.<url>.*` settings
    /// match it.
    pub fn origin(&self) -> String {
        let host = match self.ip() {
            Some(IpAddr::V6(_)) => format!("[{}]", self.host),
            _ => self.host.clone(),
        };
        if self.explicit_port {
            format!("{}://{host}:{}", self.scheme, self.port)
        } else {
            format!("{}://{host}", self.scheme)
        }
    }

    /// The host, when it is an IP address.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

/// A login for one host: a user name and a password or token.
#[derive(Clone, PartialEq, Eq)]
pub struct Login {
    pub username: String,
    pub secret: String,
}

impl std::fmt::Debug for Login {
    // The secret is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The environment variables a login reaches its helper through.
const USERNAME_VAR: &str = "CORDON_GIT_USERNAME";
const SECRET_VAR: &str = "CORDON_GIT_SECRET";

/// A credential helper answering `get` with the login in its environment
/// (git runs it with `sh`; the values are never on a command line).
const LOGIN_HELPER: &str = "!f() { test \"$1\" = get || exit 0; \
    printf 'username=%s\\npassword=%s\\n' \"$CORDON_GIT_USERNAME\" \"$CORDON_GIT_SECRET\"; }; f";

/// ssh as git runs it for the host's user when their configuration names
/// no other: never a prompt (nothing could answer it).
const DEFAULT_SSH: &str = "ssh -o BatchMode=yes";

/// The means to reach a repository, given only to the git commands that
/// talk to a remote.
#[derive(Clone, Default)]
pub struct HostCredentials {
    helpers: Vec<String>,
    env: Vec<(OsString, OsString)>,
    /// Settings for this remote alone (a login, pinned addresses).
    settings: Vec<(String, String)>,
    /// Whether ssh may run, with the host user's agent and keys (the
    /// command is in `env`; without it, git's stays `false`).
    ssh: bool,
}

impl std::fmt::Debug for HostCredentials {
    // The environment can hold a secret: only its names are printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCredentials")
            .field("helpers", &self.helpers)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("ssh", &self.ssh)
            .finish_non_exhaustive()
    }
}

impl HostCredentials {
    /// What this process's user has: `credential.helper` and
    /// `core.sshCommand` from the user's and the system's git
    /// configuration (which are theirs, not the workspace's), and `HOME`,
    /// `XDG_CONFIG_HOME` and `SSH_AUTH_SOCK`.
    pub fn from_host() -> HostCredentials {
        HostCredentials::from_env(
            ["HOME", "XDG_CONFIG_HOME", "SSH_AUTH_SOCK"]
                .into_iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v)))
                .collect(),
        )
    }

    /// As [`HostCredentials::from_host`], for a user whose `HOME` (and
    /// `XDG_CONFIG_HOME`, `SSH_AUTH_SOCK`) are `env`.
    pub fn from_env(env: Vec<(OsString, OsString)>) -> HostCredentials {
        let user_git = || {
            let mut cmd = std::process::Command::new("git");
            cmd.env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                // From no repository: only the user's and the system's files.
                .current_dir("/")
                .env("GIT_CEILING_DIRECTORIES", "/");
            cmd
        };
        // One read of both settings, in the order git reads its files.
        let found = user_git()
            .args([
                "config",
                "-z",
                "--get-regexp",
                r"^(credential\.helper|core\.sshcommand)$",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| o.stdout)
            .unwrap_or_default();
        let mut helpers: Vec<String> = Vec::new();
        let mut ssh_command = None;
        for entry in found.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            let entry = String::from_utf8_lossy(entry);
            let (key, value) = entry.split_once('\n').unwrap_or((&entry, ""));
            match key {
                // An empty entry resets the list: only what follows the
                // last one counts.
                "credential.helper" if value.is_empty() => helpers.clear(),
                "credential.helper" => helpers.push(value.to_string()),
                // The last one wins, as in git.
                "core.sshcommand" => ssh_command = Some(value.trim().to_string()),
                _ => {}
            }
        }
        // The user's own ssh command (`core.sshCommand`, as their git
        // would run it), else ssh that never prompts.
        let ssh_command = ssh_command
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_SSH.to_string());
        let mut env = env;
        env.push(("GIT_SSH_COMMAND".into(), ssh_command.into()));
        HostCredentials {
            helpers,
            env,
            settings: Vec::new(),
            ssh: true,
        }
    }

    /// For someone other than the host's user (a tenant): nothing of the
    /// host's (no helper, no home, no SSH agent), `login` given to
    /// `endpoint` alone, connections made to `addrs` only (the addresses
    /// its name was checked to resolve to; none for an IP address), and no
    /// redirect followed, so that git reaches no other host than the one
    /// checked.
    pub fn remote(endpoint: &Endpoint, login: Option<&Login>, addrs: &[IpAddr]) -> HostCredentials {
        let mut creds = HostCredentials::default();
        let set = |creds: &mut HostCredentials, k: String, v: String| creds.settings.push((k, v));
        set(&mut creds, "http.followRedirects".into(), "false".into());
        set(&mut creds, "http.proxy".into(), String::new());
        if endpoint.ip().is_none() && !addrs.is_empty() {
            let shown: Vec<String> = addrs
                .iter()
                .map(|a| match a {
                    IpAddr::V6(v6) => format!("[{v6}]"),
                    IpAddr::V4(v4) => v4.to_string(),
                })
                .collect();
            set(
                &mut creds,
                "http.curloptResolve".into(),
                format!("{}:{}:{}", endpoint.host, endpoint.port, shown.join(",")),
            );
        }
        if let Some(login) = login {
            set(
                &mut creds,
                format!("credential.{}.helper", endpoint.origin()),
                LOGIN_HELPER.into(),
            );
            creds
                .env
                .push((USERNAME_VAR.into(), login.username.clone().into()));
            creds
                .env
                .push((SECRET_VAR.into(), login.secret.clone().into()));
        }
        creds
    }

    /// `git` with these credentials, for a command that talks to a remote.
    pub(crate) fn apply(&self, mut git: Git) -> Git {
        for (k, v) in &self.env {
            git = git.env(k.clone(), v.clone());
        }
        for h in &self.helpers {
            git = git.setting("credential.helper", h);
        }
        for (k, v) in &self.settings {
            git = git.setting(k, v);
        }
        git
    }

    /// Whether these credentials let ssh run (the host user's own).
    pub fn allows_ssh(&self) -> bool {
        self.ssh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_helpers_and_ssh_command_are_read_as_git_reads_them() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".gitconfig"),
            "[credential]\n\thelper = first\n\thelper =\n\thelper = store\n\
             [core]\n\tsshCommand = ssh -i one\n[core]\n\tsshcommand = ssh -i two\n",
        )
        .unwrap();
        let creds = HostCredentials::from_env(vec![("HOME".into(), home.path().into())]);
        assert_eq!(creds.helpers, ["store"]);
        let ssh = creds.env.iter().find(|(k, _)| k == "GIT_SSH_COMMAND");
        assert_eq!(ssh.map(|(_, v)| v.to_str().unwrap()), Some("ssh -i two"));

        let empty = tempfile::tempdir().unwrap();
        let creds = HostCredentials::from_env(vec![("HOME".into(), empty.path().into())]);
        assert!(creds.helpers.is_empty());
        let ssh = creds.env.iter().find(|(k, _)| k == "GIT_SSH_COMMAND");
        assert_eq!(ssh.map(|(_, v)| v.to_str().unwrap()), Some(DEFAULT_SSH));
    }

    #[test]
    fn endpoints_of_urls() {
        for (url, want) in [
            (
                "https://GitHub.com/o/r.git",
                Some(("https", "github.com", 443, "github.com")),
            ),
            (
                "http://127.0.0.1:8080/o/r",
                Some(("http", "127.0.0.1", 8080, "127.0.0.1:8080")),
            ),
            (
                "https://bob@git.example/o/r",
                Some(("https", "git.example", 443, "git.example")),
            ),
            (
                "https://[::1]:3000/o/r",
                Some(("https", "::1", 3000, "[::1]:3000")),
            ),
            ("ssh://git.example/o/r", None),
            ("git@github.com:o/r.git", None),
            ("https://:443/o", None),
            ("https://h:0/o", None),
            ("https://h:99999/o", None),
            ("https://-h/o", None),
            ("https://h_/o", None),
        ] {
            let got = Endpoint::of_url(url);
            assert_eq!(
                got.as_ref()
                    .map(|e| (e.scheme, e.host.as_str(), e.port, e.key())),
                want.map(|(s, h, p, k)| (s, h, p, k.to_string())),
                "{url}"
            );
        }
        let e = Endpoint::of_url("https://[::1]:3000/o/r").unwrap();
        assert_eq!(e.origin(), "https://[::1]:3000");
    }

    #[test]
    fn a_login_is_in_no_setting_and_not_printed() {
        let e = Endpoint::of_url("https://git.example/o/r").unwrap();
        let login = Login {
            username: "bot".into(),
            secret: "tok-SECRET-1".into(),
        };
        let c = HostCredentials::remote(&e, Some(&login), &["192.0.2.7".parse().unwrap()]);
        let secret = "tok-SECRET-1";
        assert!(!format!("{c:?}").contains(secret));
        assert!(!format!("{login:?}").contains(secret));
        assert!(
            c.settings
                .iter()
                .all(|(k, v)| !k.contains(secret) && !v.contains(secret))
        );
        assert!(c.settings.contains(&(
            "http.curloptResolve".into(),
            "git.example:443:192.0.2.7".into()
        )));
        assert!(!c.allows_ssh());
    }
}
