//! `[mcp_servers.NAME]` in the configuration files: the user's
//! (`~/.config/cordon/config.toml`) and the project's
//! (`.cordon/config.toml`) when the user trusts it, the project's winning
//! for a name in both. The agent's settings read the files (once, and
//! decide which are trusted); this module checks their tables.
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

/// The servers of these `[mcp_servers]` tables, in order of precedence
/// (lowest first), each with the file it came from.
pub fn from_tables(
    tables: &[(PathBuf, toml::Table)],
) -> Result<BTreeMap<String, ServerSpec>, McpConfigError> {
    let mut servers = BTreeMap::new();
    for (path, table) in tables {
        for (name, value) in table {
            let spec: ServerSpec = value.clone().try_into().map_err(|e: toml::de::Error| {
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
            servers.insert(name.clone(), spec);
        }
    }
    Ok(servers)
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

    fn table(text: &str) -> toml::Table {
        match text.parse::<toml::Table>().unwrap().remove("mcp_servers") {
            Some(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        }
    }

    #[test]
    fn later_entries_win_and_bad_ones_are_named() {
        let user = PathBuf::from("/home/u/.config/cordon/config.toml");
        let project = PathBuf::from("/p/.cordon/config.toml");
        let s = from_tables(&[
            (
                user.clone(),
                table(
                    "[mcp_servers.a]\ncommand = \"one\"\n[mcp_servers.b]\nurl = \"http://h/mcp\"\n",
                ),
            ),
            (
                project.clone(),
                table("[mcp_servers.a]\ncommand = \"two\"\nargs = [\"-v\"]\n"),
            ),
        ])
        .unwrap();
        assert_eq!(s["a"].command.as_deref(), Some("two"));
        assert_eq!(s["a"].args, ["-v"]);
        assert_eq!(s["b"].url.as_deref(), Some("http://h/mcp"));

        let one = |text: &str| from_tables(&[(project.clone(), table(text))]);
        let e = one("[mcp_servers.c]\nargs = []\n").unwrap_err().to_string();
        assert!(
            e.contains("[mcp_servers.c] needs either `command` or `url`") && e.contains("/p/"),
            "{e}"
        );
        let e = one("[mcp_servers.d]\ncommand = \"x\"\ncomand = \"typo\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("comand"), "{e}");
        assert!(one("[mcp_servers.\"a b\"]\ncommand = \"x\"\n").is_err());
    }
}
