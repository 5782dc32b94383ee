//! `cordon image` as a user types it: pull from an OCI layout and a
//! `docker save` archive, list, remove, prune; bad references refused with
//! the form to use.

use std::process::{Command, Output};

use cordon_testkit::oci::{two_layers, write_layout};

fn cordon(store: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cordon"))
        .env("CORDON_IMAGE_STORE", store)
        .args(["image"])
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn pull_list_remove_and_prune() {
    let dir = tempfile::tempdir().unwrap();
    let (src, store) = (dir.path().join("layout"), dir.path().join("store"));
    let manifest = write_layout(&src, "v1", &two_layers());

    let ls = cordon(&store, &["ls"]);
    assert!(
        text(&ls.stdout).contains("no images"),
        "{}",
        text(&ls.stdout)
    );

    let reference = format!("oci:{}:v1", src.display());
    let out = cordon(&store, &["pull", &reference]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&manifest),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains("2 layers"),
        "{}",
        text(&out.stdout)
    );

    let ls = cordon(&store, &["ls", "--json"]);
    let images: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(images[0]["name"], reference.as_str());
    assert_eq!(images[0]["manifest"], manifest.as_str());
    assert_eq!(images[0]["working_dir"], "/srv");
    let table = text(&cordon(&store, &["ls"]).stdout);
    assert!(
        table.starts_with("NAME") && table.contains(&reference),
        "{table}"
    );

    // The same image from what `docker save` writes.
    let archive = dir.path().join("saved.tar");
    let skopeo = Command::new("skopeo")
        .args(["copy", "--quiet", &reference])
        .arg(format!(
            "docker-archive:{}:team/tools:v1",
            archive.display()
        ))
        .output()
        .expect("skopeo is missing: scripts/packages.txt installs it");
    assert!(skopeo.status.success(), "{}", text(&skopeo.stderr));
    let from_archive = format!("docker-archive:{}", archive.display());
    let out = cordon(&store, &["pull", &from_archive]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    for name in [&reference, &from_archive] {
        let out = cordon(&store, &["rm", name]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = cordon(&store, &["rm", &reference]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no image"),
        "{}",
        text(&out.stderr)
    );
    let out = cordon(&store, &["prune"]);
    assert!(
        text(&out.stdout).starts_with("freed "),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(std::fs::read_dir(store.join("layers")).unwrap().count(), 0);
}

#[test]
fn a_bad_reference_says_the_forms_that_work() {
    let dir = tempfile::tempdir().unwrap();
    for (bad, says) in [
        ("oci:", "oci:DIR[:TAG]"),
        ("Not/Lower", "lower case"),
        ("oci:/nonexistent/layout", "cannot open /nonexistent/layout"),
    ] {
        let out = cordon(dir.path(), &["pull", bad]);
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains(says),
            "{bad}: {}",
            text(&out.stderr)
        );
    }
}
