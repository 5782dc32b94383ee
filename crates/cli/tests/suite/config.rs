//! `cordon config` end to end: layers, sources, masking, bad files.

use std::process::Command;

fn cordon_config(home: &std::path::Path, cwd: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cordon"));
    c.arg("config")
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("XDG_CONFIG_HOME", home);
    c
}

#[test]
fn shows_each_value_with_its_source_and_masks_secrets() {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("cordon")).unwrap();
    std::fs::write(
        home.path().join("cordon/config.toml"),
        "model = \"from-user-file\"\n[sandbox]\npids = 64\n",
    )
    .unwrap();
    std::fs::write(
        cwd.path().join(".env"),
        "ANTHROPIC_API_KEY=sk-ant-api03-verysecretvalue-XYZW\n",
    )
    .unwrap();
    // The project's .env is the user's own: trusted as it is.
    let trusted = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .arg("trust")
        .current_dir(cwd.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("XDG_CONFIG_HOME", home.path())
        .output()
        .unwrap();
    assert!(trusted.status.success(), "{trusted:?}");
    let out = cordon_config(home.path(), cwd.path())
        .env("MAX_TOKENS", "1234")
        .args(["--set", "approval=ask"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{k} ")))
            .unwrap_or_else(|| panic!("{k} missing: {text}"))
            .to_string()
    };
    assert!(
        line("model").contains("from-user-file") && line("model").contains("cordon/config.toml")
    );
    assert!(
        line("max_tokens").contains("1234")
            && line("max_tokens").contains("environment (MAX_TOKENS)")
    );
    assert!(line("approval").contains("ask") && line("approval").contains("command line"));
    assert!(line("sandbox.pids").contains("64"));
    assert!(
        line("anthropic_api_key").contains("sk-ant…XYZW")
            && line("anthropic_api_key").contains(".env")
    );
    assert!(!text.contains("verysecretvalue"), "secret leaked: {text}");
}

#[test]
fn a_bad_config_file_is_one_clear_line_and_exit_78() {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cwd.path().join(".cordon")).unwrap();
    std::fs::write(
        cwd.path().join(".cordon/config.toml"),
        "model = [unclosed\n",
    )
    .unwrap();
    let out = cordon_config(home.path(), cwd.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("cordon: config file ") && err.contains(".cordon/config.toml"),
        "{err}"
    );
}
