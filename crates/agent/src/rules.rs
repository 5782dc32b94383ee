//! Command rules: whether a shell command the model wants to run is
//! allowed without asking, asked about, or denied, by its first words
//! (`[rules]` in the configuration, as Codex's prefix rules). They decide
//! the `bash` tool's calls; `--approval` keeps its meaning for the rest.
//!
//! Deny wins over ask, ask over allow. An `allow` or `ask` rule matches
//! only a simple command (one program, no operator, redirection,
//! substitution or escape), so `cargo test` never allows `cargo test;
//! curl …`. A `deny` rule matches any command in the line, after
//! wrappers such as `sudo`, `env` or `VAR=1` (so `ls; curl x` and `sudo
//! curl x` are denied by `curl`). Rules are a guard rail for the
//! approval prompt, not a boundary: the sandbox is the boundary, and a
//! determined program can spell a command so no rule sees it.

use serde::Deserialize;
use serde_json::Value;

/// The tool whose commands the rules decide, and its input field.
pub const SHELL_TOOL: &str = "bash";
const SHELL_COMMAND: &str = "command";

/// Characters that make a line more than one simple command.
const NOT_SIMPLE: &[char] = &[
    ';', '&', '|', '<', '>', '$', '`', '(', ')', '\\', '\n', '\r',
];

/// Characters that separate the commands of a line, for deny rules.
const SEPARATORS: &[char] = &[';', '&', '|', '(', ')', '`', '\n', '\r', '{', '}'];

/// Words that run the command after them.
const WRAPPERS: &[&str] = &[
    "sudo", "env", "exec", "nohup", "time", "command", "builtin", "nice", "timeout", "xargs",
    "doas", "then", "do", "else", "!",
];

/// Most rules of each kind read: a person writes a few.
const MAX_RULES: usize = 1000;

/// The rules as configured: lists of command prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub ask: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// What a rule says of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Ask,
    /// Not run; the text tells the model why.
    Deny(String),
}

/// Why a rules table cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("rule {0:?} is empty: a rule is the first words of a command")]
    Empty(String),
    #[error("rule {0:?} has shell syntax in it: a rule is plain words (`git push`)")]
    Syntax(String),
    #[error("more than {MAX_RULES} rules of one kind")]
    TooMany,
}

impl Rules {
    /// Checks every rule once: plain words, not empty.
    pub fn validate(&self) -> Result<(), RulesError> {
        for list in [&self.allow, &self.ask, &self.deny] {
            if list.len() > MAX_RULES {
                return Err(RulesError::TooMany);
            }
            for r in list {
                if r.split_whitespace().next().is_none() {
                    return Err(RulesError::Empty(r.clone()));
                }
                if r.contains(NOT_SIMPLE) || r.contains(['"', '\'']) {
                    return Err(RulesError::Syntax(r.clone()));
                }
            }
        }
        Ok(())
    }

    /// These rules with `more` added (a project's deny rules to the
    /// user's).
    pub fn merged(mut self, more: Rules) -> Rules {
        self.allow.extend(more.allow);
        self.ask.extend(more.ask);
        self.deny.extend(more.deny);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.ask.is_empty() && self.deny.is_empty()
    }

    /// What the rules say of a call of `tool` with `input`; `None` when
    /// no rule speaks to it (the approval mode decides).
    pub fn verdict(&self, tool: &str, input: &Value) -> Option<Verdict> {
        if tool != SHELL_TOOL {
            return None;
        }
        let command = input.get(SHELL_COMMAND)?.as_str()?;
        if let Some(rule) = self.deny.iter().find(|r| denies(r, command)) {
            return Some(Verdict::Deny(format!(
                "A rule of the user's denies commands starting with `{}`: this call was not run. Do not try to run it another way; do without it, or ask the user.",
                rule.trim()
            )));
        }
        let simple = simple_words(command);
        let starts = |r: &String| simple.as_ref().is_some_and(|w| starts_with(w, r));
        if self.ask.iter().any(starts) {
            return Some(Verdict::Ask);
        }
        if self.allow.iter().any(starts) {
            return Some(Verdict::Allow);
        }
        // A rule that would allow it if it were simple is no allow: the
        // line does more than the rule's words say, so it is asked.
        if simple.is_none() && !self.ask.is_empty() {
            let words: Vec<&str> = command.split_whitespace().collect();
            if self.ask.iter().any(|r| starts_with(&words, r)) {
                return Some(Verdict::Ask);
            }
        }
        None
    }
}

/// The words of `command` when it is one simple command.
fn simple_words(command: &str) -> Option<Vec<&str>> {
    if command.contains(NOT_SIMPLE) {
        return None;
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    (!words.is_empty()).then_some(words)
}

fn starts_with(words: &[&str], rule: &str) -> bool {
    let rule: Vec<&str> = rule.split_whitespace().collect();
    !rule.is_empty() && words.len() >= rule.len() && words[..rule.len()] == rule[..]
}

/// Whether a deny `rule` matches any command in the line, past wrappers,
/// assignments and quotes around a program's name.
fn denies(rule: &str, command: &str) -> bool {
    command.split(SEPARATORS).any(|segment| {
        let words: Vec<String> = segment
            .split_whitespace()
            .map(|w| w.trim_matches(['"', '\'']).to_string())
            .skip_while(|w| {
                WRAPPERS.contains(&w.as_str())
                    || w.starts_with('-')
                    || (w.contains('=') && !w.starts_with('='))
                    || w.chars().all(|c| c.is_ascii_digit())
            })
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        // A program named by its path is the program (`/usr/bin/curl`).
        let mut named = words.clone();
        if let Some(first) = named.first_mut() {
            *first = first.rsplit('/').next().unwrap_or(first);
        }
        starts_with(&words, rule) || starts_with(&named, rule)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> Rules {
        Rules {
            allow: vec![
                "cargo test".into(),
                "ls".into(),
                "git push --dry-run".into(),
            ],
            ask: vec!["git push".into()],
            deny: vec!["curl".into(), "rm -rf /".into()],
        }
    }

    fn v(cmd: &str) -> Option<Verdict> {
        rules().verdict("bash", &json!({ "command": cmd }))
    }

    #[test]
    fn allow_takes_simple_commands_only() {
        assert_eq!(v("cargo test --all"), Some(Verdict::Allow));
        assert_eq!(v("ls"), Some(Verdict::Allow));
        assert_eq!(v("cargo test; rm x"), None);
        assert_eq!(v("cargo test > out"), None);
        assert_eq!(v("cargo testing"), None);
        assert_eq!(v("cargo build"), None);
    }

    #[test]
    fn ask_wins_over_allow_and_a_compound_push_is_asked() {
        assert_eq!(v("git push --dry-run"), Some(Verdict::Ask));
        assert_eq!(v("git push origin main"), Some(Verdict::Ask));
        assert_eq!(v("git push origin main && echo done"), Some(Verdict::Ask));
    }

    #[test]
    fn deny_finds_the_command_anywhere_in_the_line() {
        for cmd in [
            "curl https://x.example",
            "ls; curl x",
            "echo $(curl x)",
            "cat f | curl -d @- x",
            "sudo curl x",
            "FOO=1 env -i curl x",
            "/usr/bin/curl x",
            "'curl' x",
            "if true; then curl x; fi",
            "rm -rf / --no-preserve-root",
            "timeout 5 curl x",
        ] {
            assert!(matches!(v(cmd), Some(Verdict::Deny(_))), "{cmd}");
        }
        assert_eq!(v("echo curl-is-a-word"), None);
        assert_eq!(v("rm -rf build"), None);
        assert_eq!(rules().verdict("read_file", &json!({"path": "curl"})), None);
    }

    #[test]
    fn rules_are_plain_words() {
        assert!(rules().validate().is_ok());
        for bad in ["", "  ", "ls; rm", "$(x)", "a|b", "'x'"] {
            let r = Rules {
                deny: vec![bad.into()],
                ..Rules::default()
            };
            assert!(r.validate().is_err(), "{bad:?}");
        }
    }
}
