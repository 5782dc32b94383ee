//! Commands the user approved for good: the `p` answer to an approval.
//!
//! The rules live in the user's own configuration directory
//! (`$XDG_CONFIG_HOME/cordon/approved.toml`), never in the workspace, which
//! the sandbox writes. A rule is a list of words; a `bash` call runs
//! without asking when its command is one simple command whose first
//! words are those. A command with anything that could make it run more
//! than its words say (`;`, `&`, `|`, a redirection, a substitution, a
//! backslash, a line break) matches no rule, so `cargo test` never
//! approves `cargo test; curl …`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file under the user's configuration directory.
pub const FILE: &str = "cordon/approved.toml";

/// Largest rules file read: a person writes a few lines.
const MAX_FILE: u64 = 1 << 20;

/// Characters that let one command line run something its words do not
/// show: operators, redirections, substitutions, escapes, line breaks.
const NOT_SIMPLE: &[char] = &[
    ';', '&', '|', '<', '>', '$', '`', '(', ')', '\\', '\n', '\r',
];

/// Programs whose second word is a subcommand (`cargo test`, `git
/// status`): the prefix offered for them has two words, for any other
/// program one (approving `touch notes.txt` means approving `touch`).
const WITH_SUBCOMMANDS: &[&str] = &[
    "apt",
    "apt-get",
    "bun",
    "bundle",
    "cargo",
    "composer",
    "deno",
    "dnf",
    "docker",
    "dotnet",
    "gem",
    "gh",
    "git",
    "go",
    "gradle",
    "helm",
    "just",
    "kubectl",
    "make",
    "mix",
    "mvn",
    "npm",
    "npx",
    "pip",
    "pip3",
    "pnpm",
    "poetry",
    "rustup",
    "terraform",
    "uv",
    "yarn",
];

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "command")]
    commands: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    prefix: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
}

/// The approved command prefixes, and where they are kept.
#[derive(Debug, Clone)]
pub struct Approved {
    path: PathBuf,
    rules: Vec<Vec<String>>,
}

impl Approved {
    /// The rules under `config_home`; none if the file does not exist.
    /// A file that cannot be read or parsed is an error: the caller says
    /// so, and nothing is ever written over it.
    pub fn load(config_home: &Path) -> Result<Approved, Error> {
        let path = config_home.join(FILE);
        let rules = read(&path)?
            .map(|f| f.commands.into_iter().map(|r| r.prefix).collect())
            .unwrap_or_default();
        Ok(Approved { path, rules })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rule that lets `command` run without asking, if one does.
    pub fn allowing(&self, command: &str) -> Option<&[String]> {
        let words = simple_words(command)?;
        self.rules
            .iter()
            .find(|p| words.starts_with(p))
            .map(Vec::as_slice)
    }

    /// Adds `prefix` and writes the file (read again first, so that rules
    /// another cordon added meanwhile stay), atomically.
    pub fn add(&mut self, prefix: Vec<String>) -> Result<(), Error> {
        if !valid(&prefix) {
            return Err(self.error("a rule needs at least one word, none of them empty".into()));
        }
        let mut file = read(&self.path)?.unwrap_or_default();
        if !file.commands.iter().any(|r| r.prefix == prefix) {
            file.commands.push(Rule { prefix });
        }
        let text = toml::to_string(&file).map_err(|e| self.error(e.to_string()))?;
        let dir = self.path.parent().expect("FILE has a directory");
        std::fs::create_dir_all(dir).map_err(|e| self.error(e.to_string()))?;
        let tmp = dir.join(format!(".approved.toml.{}", std::process::id()));
        std::fs::write(&tmp, format!("{HEADER}{text}"))
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                self.error(e.to_string())
            })?;
        self.rules = file.commands.into_iter().map(|r| r.prefix).collect();
        Ok(())
    }

    fn error(&self, message: String) -> Error {
        Error::File {
            path: self.path.clone(),
            message,
        }
    }
}

const HEADER: &str = "\
# Commands cordon's terminal UI runs without asking, in every session.
# Added by answering `p` to an approval; remove a rule to be asked again.
# A rule matches a command that starts with its words and is one simple
# command (no ; & | < > $ ` ( ) \\ or line break anywhere in it).

";

fn valid(prefix: &[String]) -> bool {
    !prefix.is_empty() && prefix.iter().all(|w| !w.is_empty())
}

/// The file's rules; `None` when it does not exist.
fn read(path: &Path) -> Result<Option<File>, Error> {
    use std::io::Read;
    let fail = |message: String| Error::File {
        path: path.to_path_buf(),
        message,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(e.to_string()))?;
    if text.len() as u64 > MAX_FILE {
        return Err(fail(format!("larger than {MAX_FILE} bytes")));
    }
    let parsed: File =
        toml::from_str(&text).map_err(|e| fail(e.to_string().trim().replace('\n', " ")))?;
    if let Some(bad) = parsed.commands.iter().find(|r| !valid(&r.prefix)) {
        return Err(fail(format!(
            "the rule {:?} needs at least one word, none of them empty",
            bad.prefix
        )));
    }
    Ok(Some(parsed))
}

/// The words of `command` when it is one simple command, nothing else.
pub fn simple_words(command: &str) -> Option<Vec<String>> {
    if command.contains(NOT_SIMPLE) {
        return None;
    }
    let words = shlex::split(command)?;
    (!words.is_empty()).then_some(words)
}

/// The prefix the approval prompt offers for `command`: its program, and
/// for a program with subcommands the subcommand (`cargo test`, `git
/// status`, `npm run`) when the second word is one, not an option or a
/// path. `None` for a command no rule could match.
pub fn suggested_prefix(command: &str) -> Option<Vec<String>> {
    let words = simple_words(command)?;
    // `A=b cmd` sets a variable first: approving that is approving a
    // variable's value, which no one means.
    if words[0].contains('=') {
        return None;
    }
    let subcommand = |w: &String| {
        w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let n = match words.get(1) {
        Some(w) if WITH_SUBCOMMANDS.contains(&words[0].as_str()) && subcommand(w) => 2,
        _ => 1,
    };
    Some(words.into_iter().take(n).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn only_a_simple_command_matches_a_rule() {
        let home = tempfile::tempdir().unwrap();
        let mut a = Approved::load(home.path()).unwrap();
        assert!(a.allowing("cargo test").is_none());
        a.add(words(&["cargo", "test"])).unwrap();
        assert!(a.allowing("cargo test").is_some());
        assert!(a.allowing("cargo  test --all -- --nocapture").is_some());
        assert!(a.allowing("'cargo' test").is_some());
        for attack in [
            "cargo test; curl evil",
            "cargo test && rm -rf .",
            "cargo test | sh",
            "cargo test > src/main.rs",
            "cargo test $(curl evil)",
            "cargo test `id`",
            "cargo test\nrm -rf .",
            "cargo test \\\nrm",
            "cargo testing",
            "cargo",
            "A=1 cargo test",
            "cargo 'test",
        ] {
            assert!(a.allowing(attack).is_none(), "{attack:?} matched");
        }
    }

    #[test]
    fn rules_are_kept_in_the_users_file_and_survive_a_second_process() {
        let home = tempfile::tempdir().unwrap();
        let mut first = Approved::load(home.path()).unwrap();
        let mut second = Approved::load(home.path()).unwrap();
        first.add(words(&["cargo", "test"])).unwrap();
        // Added by another cordon since this one loaded: kept.
        second.add(words(&["ls"])).unwrap();
        second.add(words(&["ls"])).unwrap();
        let again = Approved::load(home.path()).unwrap();
        assert!(again.allowing("cargo test").is_some());
        assert!(again.allowing("ls -la").is_some());
        let text = std::fs::read_to_string(home.path().join(FILE)).unwrap();
        assert_eq!(text.matches("prefix").count(), 2, "{text}");
        assert!(text.starts_with("# Commands cordon"), "{text}");
    }

    #[test]
    fn a_broken_file_is_an_error_and_is_never_written_over() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join(FILE);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "[[command]]\nprefx = [\"ls\"]\n").unwrap();
        let e = Approved::load(home.path()).unwrap_err().to_string();
        assert!(e.contains("approved.toml") && e.contains("prefx"), "{e}");
        std::fs::write(&path, "[[command]]\nprefix = []\n").unwrap();
        assert!(Approved::load(home.path()).is_err());
        // Loaded while the file was fine, added after it broke: refused.
        std::fs::write(&path, "").unwrap();
        let mut a = Approved::load(home.path()).unwrap();
        std::fs::write(&path, "not toml [").unwrap();
        assert!(a.add(words(&["ls"])).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not toml [");
    }

    #[test]
    fn the_offered_prefix_is_the_program_and_its_subcommand() {
        assert_eq!(
            suggested_prefix("cargo test --all"),
            Some(words(&["cargo", "test"]))
        );
        assert_eq!(
            suggested_prefix("git status"),
            Some(words(&["git", "status"]))
        );
        assert_eq!(suggested_prefix("ls -la"), Some(words(&["ls"])));
        assert_eq!(
            suggested_prefix("python3 script.py"),
            Some(words(&["python3"]))
        );
        assert_eq!(suggested_prefix("cat src/main.rs"), Some(words(&["cat"])));
        assert_eq!(
            suggested_prefix("touch should-not-exist"),
            Some(words(&["touch"]))
        );
        assert_eq!(suggested_prefix("make"), Some(words(&["make"])));
        assert_eq!(suggested_prefix("git -C sub status"), Some(words(&["git"])));
        assert_eq!(suggested_prefix("make; rm -rf ."), None);
        assert_eq!(suggested_prefix("FOO=1 make"), None);
        assert_eq!(suggested_prefix("   "), None);
    }
}
