//! `cordon trust`: lets a project's `.cordon/config.toml` and `.env` set
//! what an untrusted file may not (MCP servers, paths, endpoints, keys,
//! looser limits), for exactly the content they have now.

use std::path::{Path, PathBuf};

use crate::settings::trust::{ProjectFile, read_project_file};
use crate::settings::{DOTENV_FILE, PROJECT_FILE, TrustStore, config_home};
use clap::Args;

use crate::options::config_error;

#[derive(Args, Debug)]
pub struct TrustArgs {
    /// The project directory [default: the current directory]
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// List the trusted files, and whether each still has its trusted content
    #[arg(long, conflicts_with_all = ["revoke", "dir"])]
    pub list: bool,
    /// Stop trusting the directory's files
    #[arg(long)]
    pub revoke: bool,
}

pub fn trust(args: TrustArgs) -> i32 {
    let Some(home) = config_home() else {
        return config_error("neither XDG_CONFIG_HOME nor HOME is set: nowhere to record trust");
    };
    let mut store = match TrustStore::load(Some(&home)) {
        Ok(s) => s,
        Err(e) => return config_error(e),
    };
    if args.list {
        return list(&store);
    }
    let dir = match args
        .dir
        .map_or_else(std::env::current_dir, std::path::absolute)
    {
        Ok(d) => d,
        Err(e) => return config_error(format_args!("the project directory: {e}")),
    };
    let mut changed = false;
    for name in [PROJECT_FILE, DOTENV_FILE] {
        let path = dir.join(name);
        if args.revoke {
            if store.revoke(&path) {
                println!("no longer trusted: {}", path.display());
                changed = true;
            }
            continue;
        }
        match read_project_file(&dir, name) {
            Ok(ProjectFile::Missing) => {}
            Ok(ProjectFile::Refused(why)) => {
                return config_error(format_args!("cannot trust {}: {why}", path.display()));
            }
            Ok(ProjectFile::Content(content)) => {
                println!("trusted: {}", path.display());
                for line in summary(name, &content) {
                    println!("  {line}");
                }
                store.trust(&path, &content);
                changed = true;
            }
            Err(e) => return config_error(e),
        }
    }
    if !changed {
        let what = if args.revoke { "was trusted" } else { "exists" };
        println!(
            "neither {} nor {} {what} in {}",
            PROJECT_FILE,
            DOTENV_FILE,
            dir.display()
        );
        return 0;
    }
    match store.save(&home) {
        Ok(p) => {
            if !args.revoke {
                println!(
                    "recorded in {} (a change to a file makes it untrusted again)",
                    p.display()
                );
            }
            0
        }
        Err(e) => config_error(e),
    }
}

/// What a file sets that needs trust, for the user to check once more.
fn summary(name: &str, content: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(content);
    if name == DOTENV_FILE {
        return dotenv_names(&text)
            .into_iter()
            .map(|k| format!("sets {k}"))
            .collect();
    }
    let Ok(table) = text.parse::<toml::Table>() else {
        return vec!["(not valid TOML: cordon will refuse it)".into()];
    };
    let mut lines = Vec::new();
    for (k, v) in &table {
        match (k.as_str(), v) {
            ("mcp_servers", toml::Value::Table(servers)) => {
                for (name, spec) in servers {
                    let what = spec
                        .get("command")
                        .and_then(|c| c.as_str())
                        .map(|c| format!("runs `{c}` on the host"))
                        .or_else(|| {
                            spec.get("url")
                                .and_then(|u| u.as_str())
                                .map(|u| format!("connects to {u}"))
                        })
                        .unwrap_or_default();
                    lines.push(format!("MCP server {name}: {what}"));
                }
            }
            (section, toml::Value::Table(t)) => {
                lines.extend(t.keys().map(|k| format!("sets {section}.{k}")));
            }
            _ => lines.push(format!("sets {k}")),
        }
    }
    lines
}

/// The variable names of a `.env` (values are not shown: keys live there).
fn dotenv_names(text: &str) -> Vec<String> {
    dotenvy::from_read_iter(text.as_bytes())
        .filter_map(Result::ok)
        .map(|(k, _)| k)
        .collect()
}

fn list(store: &TrustStore) -> i32 {
    if store.files.is_empty() {
        println!("no trusted project files");
        return 0;
    }
    for f in &store.files {
        let (dir, name) = split(&f.path);
        let state = match read_project_file(dir, name) {
            Ok(ProjectFile::Content(c)) if store.trusts(&f.path, &c) => "trusted",
            Ok(ProjectFile::Content(_)) => "changed since trusted: untrusted",
            Ok(ProjectFile::Missing) => "missing",
            Ok(ProjectFile::Refused(_)) | Err(_) => "unreadable: untrusted",
        };
        println!("{}  {state}", f.path.display());
    }
    0
}

/// A trusted path as the project directory and the file's name in it.
fn split(path: &Path) -> (&Path, &str) {
    for name in [PROJECT_FILE, DOTENV_FILE] {
        if let Some(dir) = path
            .to_str()
            .and_then(|p| p.strip_suffix(name))
            .and_then(|d| d.strip_suffix('/'))
        {
            return (Path::new(dir), name);
        }
    }
    (path.parent().unwrap_or(Path::new("/")), "")
}
