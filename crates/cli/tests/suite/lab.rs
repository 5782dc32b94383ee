//! `cordon lab setup`: the pinned environment is made in cordon's cache,
//! and nothing in the directory it is run from, or in the `PYTHON*`
//! variables, takes part (a workspace is the sandbox's to write).

use std::path::Path;
use std::process::Command;

fn cordon(cwd: &Path, cache: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .current_dir(cwd)
        .env("CORDON_LAB_DIR", cache)
        // What a hostile directory would like Python to take.
        .env("PYTHONPATH", cwd)
        .env("PYTHONSTARTUP", cwd.join("startup.py"))
        .env("PYTHONSAFEPATH", "")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn setup_takes_nothing_from_the_directory_it_runs_in() {
    // A workspace a sandbox wrote: modules named like the ones setup runs.
    let ws = tempfile::tempdir().unwrap();
    let ran = ws.path().join("RAN");
    let payload = format!(
        "open({:?}, 'a').write(__name__ + '\\n')\n",
        ran.to_str().unwrap()
    );
    for module in [
        "pip/__init__.py",
        "pip/__main__.py",
        "venv/__init__.py",
        "venv/__main__.py",
    ] {
        let p = ws.path().join(module);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, &payload).unwrap();
    }
    for module in [
        "sitecustomize.py",
        "usercustomize.py",
        "startup.py",
        "json.py",
        "platform.py",
    ] {
        std::fs::write(ws.path().join(module), &payload).unwrap();
    }
    let cache = tempfile::tempdir().unwrap();

    let (code, out, err) = cordon(ws.path(), cache.path(), &["lab", "setup"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("JupyterLab 4.6.6 and ipykernel 7.4.0 ready"),
        "{out}"
    );
    assert!(err.contains("installing the pinned packages"), "{err}");
    assert!(
        !ran.exists(),
        "a module from the directory ran: {}",
        std::fs::read_to_string(&ran).unwrap()
    );

    // The environment is in the cache, complete, and nowhere else.
    let envs: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(envs.len(), 1, "{envs:?}");
    let env = cache.path().join(&envs[0]);
    assert!(env.join(".cordon-lab.json").is_file());
    assert!(env.join("bin/python").exists());
    assert!(!ws.path().join(&envs[0]).exists());

    // Again: nothing to do.
    let (code, _, err) = cordon(ws.path(), cache.path(), &["lab", "setup"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("already set up"), "{err}");

    // A half-made environment (no marker) is made again, not trusted.
    std::fs::remove_file(env.join(".cordon-lab.json")).unwrap();
    let (code, _, err) = cordon(ws.path(), cache.path(), &["lab", "setup"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("making a virtual environment"), "{err}");
    assert!(!ran.exists());
}
