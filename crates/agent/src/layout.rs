//! The layering of [`crate::LAYERS`], checked on the sources by the
//! testkit's checker.

#[test]
fn no_module_uses_one_above_it() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    cordon_testkit::layout::check(&src, crate::LAYERS);
}
