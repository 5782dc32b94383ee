//! Presets read the host tools' own configuration. These tests give the
//! tools a made-up configuration in a temporary home and check what the
//! presets find; only the last one looks at this machine's real setup.

use std::collections::BTreeMap;
use std::path::Path;

use cordon_net::preset_table::expand;
use cordon_net::presets::expand_preset;
use cordon_net::{PolicySpec, PresetEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An environment with only PATH (and pyenv's root, which its shims need)
/// from this process, and `home` as HOME.
fn env_in(home: &Path) -> PresetEnv {
    let mut vars = BTreeMap::new();
    for k in ["PATH", "PYENV_ROOT"] {
        if let Ok(v) = std::env::var(k) {
            vars.insert(k.to_string(), v);
        }
    }
    vars.insert("HOME".into(), home.display().to_string());
    PresetEnv {
        vars,
        apt_dir: home.join("apt"),
        untrusted: Vec::new(),
    }
}

fn shown(rules: &[cordon_net::Rule]) -> Vec<String> {
    rules.iter().map(ToString::to_string).collect()
}

/// A "simple" index whose pages link to a file on another host and to one
/// next to the index.
async fn simple_index() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let body = "<html><body><a href=\"http://files.test:8081/packages/pip-1.whl#sha256=00\">pip-1.whl</a>\
                            <a href=\"../../packages/pip-2.whl\">pip-2.whl</a></body></html>";
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn python_follows_pip_configuration_and_the_index_file_host() {
    let home = tempfile::tempdir().unwrap();
    let port = simple_index().await;
    let conf = home.path().join(".config/pip");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("pip.conf"),
        format!("[global]\nindex-url = http://127.0.0.1:{port}/simple\nextra-index-url = https://extra.invalid:8443/simple\n"),
    )
    .unwrap();
    let x = expand_preset("python", &env_in(home.path())).await;
    let rules = shown(&x.rules);
    assert!(
        rules.contains(&format!("127.0.0.1:{port}")),
        "{rules:?} {:?}",
        x.warnings
    );
    assert!(
        rules.contains(&"extra.invalid:8443".to_string()),
        "{rules:?}"
    );
    assert!(rules.contains(&"files.test:8081".to_string()), "{rules:?}");
    // The extra index cannot be read: a warning, not a failure.
    assert!(
        x.warnings.iter().any(|w| w.contains("extra.invalid")),
        "{:?}",
        x.warnings
    );

    // The environment wins over the file, as pip has it.
    let mut env = env_in(home.path());
    env.vars.insert(
        "PIP_INDEX_URL".into(),
        "https://env-index.invalid/simple".into(),
    );
    env.vars.insert("PIP_EXTRA_INDEX_URL".into(), String::new());
    let rules = shown(&expand_preset("python", &env).await.rules);
    assert!(
        rules.contains(&"env-index.invalid:443".to_string()),
        "{rules:?}"
    );
    assert!(!rules.contains(&format!("127.0.0.1:{port}")), "{rules:?}");
}

#[tokio::test]
async fn node_follows_npmrc_including_scoped_registries() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join(".npmrc"),
        "registry=http://npm-mirror.invalid:4873/\n@corp:registry=https://corp.invalid/npm/\n",
    )
    .unwrap();
    let x = expand_preset("node", &env_in(home.path())).await;
    assert_eq!(
        shown(&x.rules),
        ["corp.invalid:443", "npm-mirror.invalid:4873"],
        "{:?}",
        x.warnings
    );
}

#[tokio::test]
async fn missing_tools_expand_to_nothing_with_a_warning() {
    let home = tempfile::tempdir().unwrap();
    let mut env = env_in(home.path());
    env.vars.insert(
        "PATH".into(),
        home.path().join("empty").display().to_string(),
    );
    for p in ["python", "node", "debian", "rust"] {
        let x = expand_preset(p, &env).await;
        assert!(x.rules.is_empty(), "{p}: {:?}", x.rules);
        assert!(
            x.warnings.iter().any(|w| w.starts_with(&format!("@{p}: "))),
            "{p}: {:?}",
            x.warnings
        );
    }
}

#[tokio::test]
async fn rust_follows_the_crates_io_replacement_and_its_download_host() {
    let home = tempfile::tempdir().unwrap();
    let cargo = home.path().join("cargo-home");
    std::fs::create_dir_all(cargo.join("registry/index/mirror.invalid-0123456789abcdef")).unwrap();
    std::fs::write(
        cargo.join("registry/index/mirror.invalid-0123456789abcdef/config.json"),
        r#"{"dl":"https://dl.mirror.invalid:8443/crates"}"#,
    )
    .unwrap();
    std::fs::write(
        cargo.join("config.toml"),
        "[source.crates-io]\nreplace-with = \"company\"\n[source.company]\nreplace-with = \"mirror\"\n\
         [source.mirror]\nregistry = \"sparse+https://mirror.invalid/index/\"\n\
         [registries.corp]\nindex = \"https://git.corp.invalid/index.git\"\n",
    )
    .unwrap();
    let mut env = env_in(home.path());
    env.vars
        .insert("CARGO_HOME".into(), cargo.display().to_string());
    env.vars.insert(
        "CARGO_REGISTRIES_OTHER_ONE_INDEX".into(),
        "sparse+http://other.invalid:8080/".into(),
    );
    let x = expand_preset("rust", &env).await;
    let mut rules = shown(&x.rules);
    rules.sort();
    assert_eq!(
        rules,
        [
            "dl.mirror.invalid:8443",
            "git.corp.invalid:443",
            "mirror.invalid:443",
            "other.invalid:8080"
        ],
        "{:?}",
        x.warnings
    );

    // With no replacement, the registries cargo's cache shows.
    std::fs::remove_file(cargo.join("config.toml")).unwrap();
    env.vars.remove("CARGO_REGISTRIES_OTHER_ONE_INDEX");
    let mut rules = shown(&expand_preset("rust", &env).await.rules);
    rules.sort();
    assert_eq!(rules, ["dl.mirror.invalid:8443", "mirror.invalid:443"]);

    // Nothing configured, nothing cached: a warning.
    std::fs::remove_dir_all(cargo.join("registry")).unwrap();
    let x = expand_preset("rust", &env).await;
    assert!(x.rules.is_empty() && !x.warnings.is_empty(), "{x:?}");
}

#[tokio::test]
async fn debian_reads_every_apt_source_format() {
    let home = tempfile::tempdir().unwrap();
    let apt = home.path().join("apt");
    std::fs::create_dir_all(apt.join("sources.list.d")).unwrap();
    std::fs::write(
        apt.join("sources.list"),
        "deb http://deb.mirror.invalid/debian bookworm main\n# deb http://commented.invalid/ x\n",
    )
    .unwrap();
    std::fs::write(
        apt.join("sources.list.d/extra.list"),
        "deb [signed-by=/k.gpg] https://extra.invalid:8443/repo stable main\n",
    )
    .unwrap();
    std::fs::write(
        apt.join("sources.list.d/main.sources"),
        "Types: deb\nURIs: http://a.invalid/debian\nSuites: bookworm\n\nTypes: deb\nURIs: http://off.invalid/\nSuites: x\nEnabled: no\n",
    )
    .unwrap();
    std::fs::write(
        apt.join("sources.list.d/skipped.list.disabled"),
        "deb http://skipped.invalid/ x\n",
    )
    .unwrap();
    let x = expand_preset("debian", &env_in(home.path())).await;
    let mut rules = shown(&x.rules);
    rules.sort();
    assert_eq!(
        rules,
        [
            "a.invalid:80",
            "deb.mirror.invalid:80",
            "extra.invalid:8443"
        ],
        "{:?}",
        x.warnings
    );
}

#[tokio::test]
async fn specs_expand_presets_and_keep_rules() {
    let home = tempfile::tempdir().unwrap();
    let spec = PolicySpec {
        allow: vec!["@git-hosting".into(), "x.invalid:8080".into()],
        allow_private: false,
    };
    let (policy, warnings) = expand(&spec, &env_in(home.path())).await.unwrap();
    let rules = shown(policy.rules());
    assert!(
        rules.contains(&"github.com:443".to_string())
            && rules.contains(&"x.invalid:8080".to_string()),
        "{rules:?}"
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    let bad = PolicySpec {
        allow: vec!["@nope".into()],
        allow_private: false,
    };
    assert!(
        expand(&bad, &env_in(home.path()))
            .await
            .unwrap_err()
            .to_string()
            .contains("@nope")
    );
}

/// This machine's own pip and npm are configured (with their defaults at
/// least), so their presets find something.
#[tokio::test]
async fn real_python_and_node_presets_find_hosts() {
    let env = PresetEnv::from_host();
    for p in ["python", "node"] {
        let x = expand_preset(p, &env).await;
        eprintln!("@{p}: {:?} {:?}", shown(&x.rules), x.warnings);
        assert!(!x.rules.is_empty(), "@{p} found nothing: {:?}", x.warnings);
    }
    // Shown, not asserted: a machine may have no cargo cache or apt.
    for p in ["rust", "debian"] {
        let x = expand_preset(p, &env).await;
        eprintln!("@{p}: {:?} {:?}", shown(&x.rules), x.warnings);
    }
}

/// The caller's working directory may be a workspace the sandbox wrote: a
/// tool run there could read an `.npmrc` or import a `pip` package from it.
/// Tools run in an empty directory, with only the environment given.
#[tokio::test]
async fn tools_run_in_an_empty_directory_with_only_the_given_environment() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let npm = bin.join("npm");
    std::fs::write(&npm, "#!/bin/sh\nn=$(ls -A | wc -l)\necho \"{\\\"registry\\\":\\\"http://cwd-$n-${CARGO_PKG_NAME:-none}.invalid/\\\"}\"\n").unwrap();
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut env = env_in(home.path());
    env.vars
        .insert("PATH".into(), format!("{}:/usr/bin:/bin", bin.display()));
    // cargo sets this for the test process; the tool must not see it.
    assert!(std::env::var("CARGO_PKG_NAME").is_ok());
    let x = expand_preset("node", &env).await;
    assert_eq!(
        shown(&x.rules),
        ["cwd-0-none.invalid:80"],
        "{:?}",
        x.warnings
    );
}

/// The workspace is the sandbox's: a tool found there (directly, through a
/// link, or through a relative PATH entry) is not run, and variables that
/// lead there (an activated workspace `.venv`, a `CARGO_HOME` in it) are
/// neither passed on nor read.
#[tokio::test]
async fn nothing_in_the_workspace_is_run_or_read() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let ws = home.path().join("ws");
    let ws_bin = ws.join("bin");
    std::fs::create_dir_all(&ws_bin).unwrap();
    let mark = ws.join("ran");
    for prog in ["python3", "npm"] {
        let p = ws_bin.join(prog);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\ntouch {}\necho '{{\"registry\":\"http://evil.invalid/\"}}'\n",
                mark.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // A trusted-looking directory whose tool is a link into the workspace.
    let linked = home.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(ws_bin.join("npm"), linked.join("npm")).unwrap();
    std::fs::create_dir_all(ws.join("cargo")).unwrap();
    std::fs::write(
        ws.join("cargo/config.toml"),
        "[registries.evil]\nindex = \"https://evil.invalid/index\"\n",
    )
    .unwrap();

    let mut env = env_in(home.path());
    env.untrusted = vec![ws.clone()];
    env.vars.insert(
        "PATH".into(),
        format!("{}:{}", ws_bin.display(), linked.display()),
    );
    env.vars
        .insert("CARGO_HOME".into(), ws.join("cargo").display().to_string());
    for p in ["python", "node", "rust"] {
        let x = expand_preset(p, &env).await;
        assert!(
            !shown(&x.rules).iter().any(|r| r.contains("evil")),
            "{p}: {:?}",
            x.rules
        );
    }
    assert!(!mark.exists(), "a workspace program ran on the host");

    // A trusted tool does not see variables that lead into the workspace.
    let bin = home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let npm = bin.join("npm");
    std::fs::write(&npm, "#!/bin/sh\necho \"{\\\"registry\\\":\\\"http://venv-${VIRTUAL_ENV:+set}${VIRTUAL_ENV:-none}.invalid/\\\"}\"\n").unwrap();
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.vars.insert(
        "PATH".into(),
        format!("ws/bin:{}:/usr/bin:/bin", bin.display()),
    );
    env.vars
        .insert("VIRTUAL_ENV".into(), ws.join(".venv").display().to_string());
    let x = expand_preset("node", &env).await;
    assert_eq!(
        shown(&x.rules),
        ["venv-none.invalid:80"],
        "{:?}",
        x.warnings
    );
}
