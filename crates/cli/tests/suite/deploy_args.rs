//! The command lines in `deploy/` are ones this `cordon` accepts: each is
//! run with `--help` appended, which clap answers only once every option
//! before it is known and its value parses. (The manifests' own schemas
//! are checked in crates/testkit/tests/suite/deploy.rs; they cannot know
//! cordon's options.) Each platform's variables are given an example value
//! first, as the platform would, so that the values are checked too.

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// `args:` lists of Kubernetes containers: `- value` lines under the key,
/// comments skipped, until the indentation returns.
fn kubernetes_args(text: &str) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() != "args:" {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let mut args = Vec::new();
        while let Some(next) = lines.peek() {
            let t = next.trim();
            let deeper = next.len() - next.trim_start().len() >= indent;
            if t.starts_with('#') || t.is_empty() {
                lines.next();
                continue;
            }
            match t.strip_prefix("- ") {
                Some(v) if deeper => {
                    args.push(v.trim_matches('"').to_string());
                    lines.next();
                }
                _ => break,
            }
        }
        all.push(args);
    }
    all
}

/// `args = [ "...", ... ]` lists of the Nomad job.
fn nomad_args(text: &str) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("args = [") {
        rest = &rest[at + "args = [".len()..];
        let end = rest.find(']').expect("a closed list");
        let args = rest[..end]
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('"'))
            .map(|l| l.trim_end_matches(',').trim_matches('"').to_string())
            .collect();
        all.push(args);
        rest = &rest[end..];
    }
    all
}

/// `[processes]` of fly.toml: whole command lines starting with `cordon`,
/// or `sh -c 'exec cordon …'` (for a variable in an argument).
fn fly_args(text: &str) -> Vec<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Fly {
        processes: std::collections::BTreeMap<String, String>,
    }
    let fly: Fly = toml::from_str(text).unwrap();
    fly.processes
        .values()
        .map(|cmd| {
            let line = cmd
                .strip_prefix("sh -c 'exec ")
                .and_then(|c| c.strip_suffix('\''))
                .unwrap_or(cmd);
            let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            assert_eq!(words[0], "cordon", "{cmd}");
            words[1..].to_vec()
        })
        .collect()
}

/// What Kubernetes, Nomad and Fly put for the variables the manifests use.
fn expand(arg: &str) -> String {
    arg.replace("$(POD_IP)", "10.1.2.3")
        .replace("${NOMAD_ADDR_relay}", "10.1.2.3:24816")
        .replace("${NOMAD_SECRETS_DIR}", "/secrets")
        .replace("${NOMAD_TASK_DIR}", "/local")
        .replace("$FLY_PRIVATE_IP", "fdaa:0:1:a7b:1::2")
}

#[test]
fn every_command_line_in_deploy_is_one_cordon_accepts() {
    let read = |p: &str| std::fs::read_to_string(repo().join(p)).unwrap();
    let mut lines = Vec::new();
    for file in [
        "deploy/kubernetes/api-deployment.yaml",
        "deploy/kubernetes/worker-deployment.yaml",
    ] {
        lines.extend(kubernetes_args(&read(file)));
    }
    lines.extend(nomad_args(&read("deploy/nomad/cordon.nomad.hcl")));
    lines.extend(fly_args(&read("deploy/fly/fly.toml")));
    assert!(lines.len() >= 6, "{lines:?}");
    for args in lines {
        assert!(matches!(args[0].as_str(), "serve" | "worker"), "{args:?}");
        assert!(
            !args.iter().any(|a| expand(a).contains('$')),
            "a variable this test does not know: {args:?}"
        );
        let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(args.iter().map(|a| expand(a)))
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cordon {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn an_option_cordon_does_not_know_is_caught() {
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["worker", "--cluster-key=secret", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // And a value it does not take.
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["worker", "--advertise=worker-1:8081", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let args = kubernetes_args(
        "        args:\n          # c\n          - worker\n          - --workers=4\n        env:\n",
    );
    assert_eq!(args, [["worker", "--workers=4"]]);
}
