//! Presets (stub).
pub const NAMES: &[&str] = &["python", "node", "rust", "debian", "git-hosting"];
pub struct PresetEnv;
pub struct Expansion;
