//! `[mcp_servers.NAME]` in the configuration files: the user's
//! (`~/.config/cordon/config.toml`) and the project's
//! (`.cordon/config.toml`), the project's winning for a name in both.
//!
//! ```toml
//! [mcp_servers.files]
//! command = "python3"
//! args = ["-m", "my_server"]
//! env = { LOG = "1" }
//!
//! [mcp_servers.remote]
//! url = "https://example.org/mcp"
//! bearer_token_env = "REMOTE_TOKEN"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// A program speaking MCP on stdin/stdout.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Added to cordon's environment for the program.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A Streamable HTTP endpoint, instead of a command.
    pub url: Option<String>,
    pub bearer_token: Option<String>,
    /// The variable holding the bearer token (kept out of the file).
    pub bearer_token_env: Option<String>,
    pub startup_timeout_secs: Option<u64>,
    pub tool_timeout_secs: Option<u64>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

impl ServerSpec {
    /// The token to send, if any; an unset variable is an error.
    pub fn bearer_token(&self) -> Result<Option<String>, String> {
        if let Some(var) = &self.bearer_token_env {
            return std::env::var(var)
                .map(Some)
                .map_err(|_| format!("bearer_token_env names {var}, which is not set"));
        }
        Ok(self.bearer_token.clone())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct McpConfigError {
    pub path: PathBuf,
    pub message: String,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    mcp_servers: BTreeMap<String, toml::Value>,
}

/// The servers configured in `files`, in order of precedence (lowest
/// first); files that do not exist are skipped.
pub fn load(files: &[PathBuf]) -> Result<BTreeMap<String, ServerSpec>, McpConfigError> {
    let mut servers = BTreeMap::new();
    for path in files {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(error(path, e.to_string())),
        };
        // Only this section: the rest of the file is the agent's to check.
        let file: File = toml::from_str(&text).map_err(|e| error(path, one_line(&e)))?;
        for (name, value) in file.mcp_servers {
            let spec: ServerSpec = value.try_into().map_err(|e: toml::de::Error| {
                error(path, format!("[mcp_servers.{name}]: {}", one_line(&e)))
            })?;
            match (&spec.command, &spec.url) {
                (Some(_), None) | (None, Some(_)) => {}
                _ => {
                    return Err(error(
                        path,
                        format!("[mcp_servers.{name}] needs either `command` or `url`"),
                    ));
                }
            }
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
            {
                return Err(error(
                    path,
                    format!(
                        "[mcp_servers.{name}]: a server's name may use letters, digits, _ and -"
                    ),
                ));
            }
            servers.insert(name, spec);
        }
    }
    Ok(servers)
}

/// The two configuration files, as the agent's settings find them.
pub fn files(config_home: Option<&Path>, cwd: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(h) = config_home {
        v.push(h.join("cordon/config.toml"));
    }
    v.push(cwd.join(".cordon/config.toml"));
    v
}

fn error(path: &Path, message: String) -> McpConfigError {
    McpConfigError {
        path: path.to_path_buf(),
        message,
    }
}

fn one_line(e: &toml::de::Error) -> String {
    e.to_string().trim().replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_entries_win_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("user.toml");
        let project = dir.path().join("project.toml");
        std::fs::write(
            &user,
            "model = \"x\"\n[mcp_servers.a]\ncommand = \"one\"\n[mcp_servers.b]\nurl = \"http://h/mcp\"\n",
        )
        .unwrap();
        std::fs::write(
            &project,
            "[mcp_servers.a]\ncommand = \"two\"\nargs = [\"-v\"]\n",
        )
        .unwrap();
        let s = load(&[
            user.clone(),
            project.clone(),
            dir.path().join("missing.toml"),
        ])
        .unwrap();
        assert_eq!(s["a"].command.as_deref(), Some("two"));
        assert_eq!(s["a"].args, ["-v"]);
        assert_eq!(s["b"].url.as_deref(), Some("http://h/mcp"));

        std::fs::write(&project, "[mcp_servers.c]\nargs = []\n").unwrap();
        let e = load(std::slice::from_ref(&project))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[mcp_servers.c] needs either `command` or `url`"),
            "{e}"
        );
        std::fs::write(
            &project,
            "[mcp_servers.d]\ncommand = \"x\"\ncomand = \"typo\"\n",
        )
        .unwrap();
        let e = load(std::slice::from_ref(&project))
            .unwrap_err()
            .to_string();
        assert!(e.contains("comand"), "{e}");
        std::fs::write(&project, "[mcp_servers.\"a b\"]\ncommand = \"x\"\n").unwrap();
        assert!(load(&[project]).is_err());
    }
}
