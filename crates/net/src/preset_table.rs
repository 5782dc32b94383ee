//! Every preset expanded once, for a server: a request that names
//! `@python` must not make the host start pip (30 concurrent requests
//! were 30 pip processes and 30 fetches of the index, all before the
//! ceiling refused them). [`PresetTable::resolve`] runs each tool once;
//! [`PresetTable::expand`] then turns a spec into a policy with no process
//! and no I/O. [`ConfigStamp`] tells, by looking at file metadata alone,
//! whether the tools' configuration may have changed since, so that the
//! owner can resolve again then and only then.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::policy::PRESETS;
use crate::policy::{Entry, Policy, PolicyError, PolicySpec};
use crate::presets::{Expansion, PresetEnv, expand_preset};

/// Each preset's rules and warnings, as the host's tools said at one time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresetTable {
    by_name: BTreeMap<String, Expansion>,
}

impl PresetTable {
    /// Asks every tool once, one after the other (a server's start, or a
    /// change of the tools' configuration).
    pub async fn resolve(env: &PresetEnv) -> PresetTable {
        let mut by_name = BTreeMap::new();
        for (name, _) in PRESETS {
            by_name.insert(name.to_string(), expand_preset(name, env).await);
        }
        PresetTable { by_name }
    }

    /// Asks the tools of the presets `spec` names, and no others (a
    /// command's one policy).
    pub async fn resolve_for(
        spec: &PolicySpec,
        env: &PresetEnv,
    ) -> Result<PresetTable, PolicyError> {
        let mut by_name = BTreeMap::new();
        for e in &spec.allow {
            if let Entry::Preset(p) = e.parse::<Entry>()?
                && !by_name.contains_key(&p)
            {
                let x = expand_preset(&p, env).await;
                by_name.insert(p, x);
            }
        }
        Ok(PresetTable { by_name })
    }

    /// A spec's policy, its presets taken from the table: no process runs.
    /// Returns the warnings of the presets it names.
    pub fn expand(&self, spec: &PolicySpec) -> Result<(Policy, Vec<String>), PolicyError> {
        let mut rules = Vec::new();
        let mut warnings = Vec::new();
        for e in &spec.allow {
            match e.parse::<Entry>()? {
                Entry::Rule(r) => rules.push(r),
                // A name outside the table does not parse as an `Entry`.
                Entry::Preset(p) => {
                    if let Some(x) = self.by_name.get(&p) {
                        rules.extend(x.rules.iter().cloned());
                        warnings.extend(x.warnings.iter().cloned());
                    }
                }
            }
        }
        Ok((Policy::new(rules, spec.allow_private), warnings))
    }
}

/// What the tools' configuration files look like now: each candidate's
/// path with its size, modification time and inode, or nothing when it is
/// missing. Two stamps differ when a file was added, removed, replaced or
/// written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigStamp(Vec<(PathBuf, Option<FileStamp>)>);

/// A file's size, modification time and inode.
type FileStamp = (u64, SystemTime, u64);

impl ConfigStamp {
    /// Looks at every file the presets' tools read their configuration
    /// from (as far as their documentation says), and at the directories
    /// of apt's sources and cargo's registry cache, whose entries count.
    pub fn now(env: &PresetEnv) -> ConfigStamp {
        let stat = |p: &Path| {
            std::fs::metadata(p).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                (
                    m.size(),
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.ino(),
                )
            })
        };
        ConfigStamp(
            config_paths(env)
                .into_iter()
                .map(|p| {
                    let s = stat(&p);
                    (p, s)
                })
                .collect(),
        )
    }
}

/// The places the presets' tools take configuration from.
fn config_paths(env: &PresetEnv) -> Vec<PathBuf> {
    let var = |k: &str| env.vars.get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let home = var("HOME");
    let in_home = |rel: &str| home.as_ref().map(|h| h.join(rel));
    let xdg = var("XDG_CONFIG_HOME").or_else(|| in_home(".config"));
    let mut out: Vec<Option<PathBuf>> = vec![
        // pip
        var("PIP_CONFIG_FILE"),
        Some("/etc/pip.conf".into()),
        Some("/etc/xdg/pip/pip.conf".into()),
        xdg.as_ref().map(|x| x.join("pip/pip.conf")),
        in_home(".pip/pip.conf"),
        var("VIRTUAL_ENV").map(|v| v.join("pip.conf")),
        // npm
        var("NPM_CONFIG_USERCONFIG"),
        var("npm_config_userconfig"),
        in_home(".npmrc"),
        Some("/etc/npmrc".into()),
        Some("/usr/etc/npmrc".into()),
        Some("/usr/local/etc/npmrc".into()),
        var("PREFIX").map(|p| p.join("etc/npmrc")),
    ];
    // cargo: its configuration and the registries its cache has used.
    let cargo = var("CARGO_HOME").or_else(|| in_home(".cargo"));
    if let Some(c) = cargo {
        out.push(Some(c.join("config.toml")));
        out.push(Some(c.join("config")));
        out.push(Some(c.join("registry/index")));
    }
    // apt: its sources and the directory of more.
    out.push(Some(env.apt_dir.join("sources.list")));
    out.push(Some(env.apt_dir.join("sources.list.d")));
    let mut paths: Vec<PathBuf> = out.into_iter().flatten().collect();
    if let Ok(dir) = std::fs::read_dir(env.apt_dir.join("sources.list.d")) {
        let mut more: Vec<PathBuf> = dir.flatten().map(|e| e.path()).take(256).collect();
        more.sort();
        paths.extend(more);
    }
    paths
}

/// Builds a policy from a spec, expanding its presets on this host.
/// Returns the policy and the presets' warnings; a bad entry is an error.
pub async fn expand(
    spec: &PolicySpec,
    env: &PresetEnv,
) -> Result<(Policy, Vec<String>), PolicyError> {
    PresetTable::resolve_for(spec, env).await?.expand(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_table_expands_without_running_anything_and_a_stamp_sees_a_change() {
        let home = tempfile::tempdir().unwrap();
        let mut vars = BTreeMap::new();
        vars.insert("HOME".to_string(), home.path().display().to_string());
        // No PATH: every tool is missing, so nothing could run anyway;
        // the table still answers every preset.
        let env = PresetEnv {
            vars,
            apt_dir: home.path().join("apt"),
            untrusted: Vec::new(),
        };
        let table = PresetTable::resolve(&env).await;
        let spec = PolicySpec {
            allow: vec![
                "@git-hosting".into(),
                "@python".into(),
                "example.com".into(),
            ],
            allow_private: false,
        };
        let (policy, warnings) = table.expand(&spec).unwrap();
        let shown: Vec<String> = policy.rules().iter().map(ToString::to_string).collect();
        assert!(shown.contains(&"github.com:443".to_string()), "{shown:?}");
        assert!(shown.contains(&"example.com".to_string()), "{shown:?}");
        assert!(
            warnings.iter().any(|w| w.starts_with("@python")),
            "{warnings:?}"
        );
        let bad = PolicySpec {
            allow: vec!["@nope".into()],
            allow_private: false,
        };
        assert!(table.expand(&bad).is_err());

        let before = ConfigStamp::now(&env);
        assert_eq!(before, ConfigStamp::now(&env));
        std::fs::create_dir_all(home.path().join(".config/pip")).unwrap();
        std::fs::write(home.path().join(".config/pip/pip.conf"), "[global]\n").unwrap();
        assert_ne!(before, ConfigStamp::now(&env));
        let before = ConfigStamp::now(&env);
        std::fs::create_dir_all(home.path().join("apt/sources.list.d")).unwrap();
        std::fs::write(home.path().join("apt/sources.list.d/x.list"), "").unwrap();
        assert_ne!(before, ConfigStamp::now(&env));
    }
}
