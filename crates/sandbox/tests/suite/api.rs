//! The library API of a live sandbox session, exercised for real: every test
//! starts actual sandboxes through the native backend. The same tests run
//! against the microvm backend in api_microvm.rs.

const BACKEND: cordon_sandbox::BackendKind = cordon_sandbox::BackendKind::Native;

include!("semantics/body.rs");
