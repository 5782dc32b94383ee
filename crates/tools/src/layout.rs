//! The layering of [`crate::LAYERS`], checked on the sources by the
//! testkit's checker.

cordon_testkit::layering_test!(crate::LAYERS);
