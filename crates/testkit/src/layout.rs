//! A crate's layering, checked on its sources: given the crate's `src` and
//! its modules from the bottom up, a module that names one at or above its
//! own place (`crate::x`, `use crate::{x, ..}`) fails the check, naming the
//! file and the module. Each crate's test is [`layering_test!`], which
//! calls [`check`] on its `src`; a crate whose `src` holds several roots
//! (a library and binaries side by side) checks each with [`check_root`].

use std::path::Path;

/// The top-level module a source file belongs to: `jobs/view.rs` is `jobs`.
fn module_of(rel: &Path) -> String {
    let first = rel.components().next().expect("a file under src");
    let first = first.as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The crate modules a source names.
fn uses(source: &str) -> Vec<String> {
    let mut named = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::C, c::{..}}`: each item's first segment.
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                named.push(name);
            }
        } else {
            named.push(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    named.retain(|n| n.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    named
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Panics, listing each file that uses a module at or above its own, if
/// any does, or if `layers` does not name exactly the modules of `src`
/// (`lib.rs` or `main.rs`, `bin/`, and the `layout.rs` test aside: a crate
/// with a `layout` module of its own names it and tests elsewhere).
pub fn check(src: &Path, layers: &[&str]) {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.retain(|file| {
        let module = module_of(file.strip_prefix(src).unwrap());
        // The crate's root, its binaries (crates of their own), and the
        // test that calls this, unless `layout` is a module of the crate.
        let test_file = module == "layout" && !layers.contains(&"layout");
        !matches!(module.as_str(), "lib" | "main" | "bin") && !test_file
    });
    judge(src, files, layers, None);
}

/// As [`check`], for one root file of a `src` that holds several: its
/// modules are those it declares (`mod x;`, each `x.rs` or `x/` beside
/// it); a name that is none of them is an item of the root, as a type is.
pub fn check_root(root: &Path, layers: &[&str]) {
    let dir = root.parent().expect("a root file in a directory");
    let text = std::fs::read_to_string(root).expect("the root is readable");
    let declared = declared_modules(&text);
    let mut files = Vec::new();
    for m in &declared {
        let file = dir.join(format!("{m}.rs"));
        if file.is_file() {
            files.push(file);
        }
        let sub = dir.join(m);
        if sub.is_dir() {
            sources(&sub, &mut files);
        }
    }
    judge(dir, files, layers, Some(&declared));
}

/// The modules a root file declares with `mod x;` (public or not).
fn declared_modules(root: &str) -> std::collections::BTreeSet<String> {
    root.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub(crate) ")
                .or(l.strip_prefix("pub "))
                .unwrap_or(l);
            Some(
                l.strip_prefix("mod ")?
                    .strip_suffix(';')?
                    .trim()
                    .to_string(),
            )
        })
        .collect()
}

/// Checks `files` (under `src`) against `layers`; with `known`, a used
/// name outside it is the root's own item, not a module.
fn judge(
    src: &Path,
    files: Vec<std::path::PathBuf>,
    layers: &[&str],
    known: Option<&std::collections::BTreeSet<String>>,
) {
    let rank = |m: &str| layers.iter().position(|l| *l == m);
    let mut wrong = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let module = module_of(rel);
        seen.insert(module.clone());
        let own = rank(&module).unwrap_or_else(|| panic!("{module} is missing from LAYERS"));
        let text = std::fs::read_to_string(&file).unwrap();
        for used in uses(&text) {
            if used == module || known.is_some_and(|k| !k.contains(&used)) {
                continue;
            }
            match rank(&used) {
                Some(r) if r < own => {}
                Some(_) => wrong.push(format!("{} uses {used}, above {module}", rel.display())),
                None => wrong.push(format!("{} uses {used}, which LAYERS lacks", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    let listed: std::collections::BTreeSet<String> = layers.iter().map(|s| s.to_string()).collect();
    assert_eq!(seen, listed, "LAYERS names every module and only those");
}

/// The test every crate has: `cordon_testkit::layering_test!(crate::LAYERS);`
/// in a test module checks the sources of the crate it is expanded in.
#[macro_export]
macro_rules! layering_test {
    ($layers:expr) => {
        #[test]
        fn no_module_uses_one_above_it() {
            let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
            $crate::layout::check(&src, $layers);
        }
    };
    // One root of a `src` that holds several (see [`check_root`]).
    (root $root:literal, $layers:expr) => {
        #[test]
        fn no_module_uses_one_above_it() {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join($root);
            $crate::layout::check_root(&root, $layers);
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_root_declares_its_modules() {
        let root =
            "//! doc\nmod a;\npub mod b;\n#[cfg(test)]\npub(crate) mod c;\nmod inline {\n}\n";
        let names: Vec<String> = super::declared_modules(root).into_iter().collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    /// A root's own items pass; a module using one above it fails.
    #[test]
    fn a_root_s_modules_are_checked_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("main.rs");
        std::fs::write(&root, "mod low;\nmod high;\nfn helper() {}\n").unwrap();
        std::fs::write(
            dir.path().join("high.rs"),
            "use crate::low;\ncrate::helper();\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("low.rs"), "").unwrap();
        // Another root's module beside it, not this root's concern.
        std::fs::write(dir.path().join("other.rs"), "use crate::high;\n").unwrap();
        super::check_root(&root, &["low", "high"]);
        std::fs::write(dir.path().join("low.rs"), "use crate::high::X;\n").unwrap();
        let upward = std::panic::catch_unwind(|| super::check_root(&root, &["low", "high"]));
        assert!(upward.is_err(), "low.rs uses high, above it");
    }

    #[test]
    fn the_checker_sees_both_forms_of_use() {
        assert_eq!(
            super::uses(
                "use crate::http::{A, B};\nuse crate::{job, store::X};\nlet x = crate::state::Shared;"
            ),
            ["http", "job", "store", "state"]
        );
    }
}
