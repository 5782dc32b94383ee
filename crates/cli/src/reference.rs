//! The references under `docs/reference/`, made from the code: every
//! command's `--help`, the configuration keys, the exit codes and the
//! network presets. The test fails when a page says other than the code;
//! `CORDON_BLESS=1 cargo test -p cordon-cli --bin cordon reference` writes
//! them again.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Command, CommandFactory};

use crate::settings::{Guard, KEYS, PROJECT_FILE};

/// What every page says first: where it comes from.
fn header(title: &str) -> String {
    format!(
        "# {title}\n\n<!-- Made from the code by crates/cli/src/reference.rs: do not edit.\n     \
         CORDON_BLESS=1 cargo test -p cordon-cli --bin cordon reference -->\n\n"
    )
}

/// The command tree as a user sees it, minus what depends on the machine
/// that renders it: the values of the variables an option reads.
fn steady(mut cmd: Command) -> Command {
    let ids: Vec<_> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |a| a.hide_env_values(true));
    }
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, steady);
    }
    cmd
}

fn commands() -> String {
    // Built first: each command's arguments are defined when it is built.
    let mut cmd = crate::Cli::command();
    cmd.build();
    let mut cmd = steady(cmd);
    let mut out = header("Commands");
    out.push_str(
        "Every command's `--help`, as `cordon` prints it. The guides say what each is for: \
         [the README](../../README.md).\n\n",
    );
    fn walk(cmd: &mut Command, path: &str, out: &mut String) {
        let help = cmd.render_long_help().to_string();
        let _ = write!(out, "## `{path}`\n\n```text\n{}\n```\n\n", help.trim_end());
        for sub in cmd.get_subcommands_mut() {
            if sub.is_hide_set() || sub.get_name() == "help" {
                continue;
            }
            let name = format!("{path} {}", sub.get_name());
            walk(sub, &name, out);
        }
    }
    walk(&mut cmd, "cordon", &mut out);
    out
}

/// Who may set a key, by its guard.
fn setters(guard: Guard) -> String {
    match guard {
        Guard::Any => "any file, the environment, the command line".into(),
        g => format!(
            "your own file, `.env`, the environment, the command line; `{PROJECT_FILE}` only \
             once you trust the project ({})",
            g.why()
        ),
    }
}

/// A table cell: pipes escaped, one line.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn configuration() -> String {
    let mut out = header("Configuration keys");
    out.push_str(
        "Every key cordon reads, in files (`~/.config/cordon/config.toml`, the project's \
         `.cordon/config.toml`), `.env`, the environment and `--set KEY=VALUE`; the later \
         wins. How the files are found and trusted: [configuration](../configuration.md).\n\n\
         | key | type | environment | default | who may set it | what it is |\n\
         |---|---|---|---|---|---|\n",
    );
    for k in KEYS {
        let env = k
            .env
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let default = k
            .default
            .map_or("none".into(), |d| format!("`{}`", cell(d)));
        let secret = if k.secret {
            " (a secret: `cordon config` masks it)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {env} | {default} | {} | {}{secret} |",
            k.name,
            cell(&k.ty.describe()),
            cell(&setters(k.guard)),
            cell(k.doc)
        );
    }
    out
}

/// The commands that end with a code of cordon's.
fn used_by(used: crate::exit::Used) -> &'static str {
    use crate::exit::Used;
    match used {
        Used::Run => "`run`, `shell`",
        Used::Exec => "`exec`",
        Used::Both => "`run`, `shell`, `exec`",
    }
}

fn exit_codes() -> String {
    let mut out = header("Exit codes");
    out.push_str(
        "`cordon run` and `cordon shell` end with the command's own status (128+N if a signal \
         N killed it), `cordon exec` with 0 when its task is done; these codes are cordon's. \
         A job of `cordon serve` records the limits' codes (122, 123, 124) as its \
         `exit_code` too.\n\n| code | commands | meaning |\n|---|---|---|\n",
    );
    for c in crate::exit::ALL {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            c.code,
            used_by(c.used),
            cell(c.meaning)
        );
    }
    out
}

fn network_presets() -> String {
    let mut out = header("Network presets");
    out.push_str(
        "An `--allow` entry (or a policy's) that starts with `@` names a preset: it expands, \
         on the host, to the hosts the host's own tools are configured to use, so a user \
         behind a mirror gets the mirror. How policies work: [network](../network.md).\n\n\
         | preset | expands to |\n|---|---|\n",
    );
    for (name, what) in cordon_net::policy::PRESETS {
        let _ = writeln!(out, "| `@{name}` | {} |", cell(what));
    }
    out.push_str("\nThe forges of `@git-hosting`: ");
    let forges: Vec<String> = cordon_net::presets::FORGES
        .iter()
        .map(|f| format!("`{f}`"))
        .collect();
    out.push_str(&forges.join(", "));
    out.push_str(".\n");
    out
}

#[test]
fn the_references_say_what_the_code_does() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference");
    let pages = [
        ("commands.md", commands()),
        ("configuration.md", configuration()),
        ("exit-codes.md", exit_codes()),
        ("network-presets.md", network_presets()),
    ];
    let bless = std::env::var_os("CORDON_BLESS").is_some();
    let mut stale = Vec::new();
    for (name, made) in pages {
        let path = dir.join(name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &made).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(made.as_str()) {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "docs/reference/{{{}}} differ from the code: run \
         CORDON_BLESS=1 cargo test -p cordon-cli --bin cordon reference",
        stale.join(",")
    );
}
