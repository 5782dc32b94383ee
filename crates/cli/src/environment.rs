//! `[environment]`: a setup run once on an image, in a build step's
//! sandbox with the network it asks for, its result the image every later
//! sandbox of the workspace starts from.
//!
//! It is a build: the base image, the inputs copied from the workspace
//! (read beneath it through no link, as any build context), the setup run
//! in `/workspace`. The build's cache is the "once": its key is the base's
//! digest, the setup's text and the inputs' content, so a change to any
//! runs the setup again and nothing else does. Only the user's own
//! configuration (or a project file they trusted) may set it: the setup
//! runs commands with a network.

use std::path::PathBuf;

use crate::settings::Environment;
use cordon_build::{Builder, Event, Options};
use cordon_image::auth::Sources;
use cordon_image::obtain::{Step, obtain};
use cordon_image::registry::Progress;
use cordon_image::store::{self, Image, Store};
use cordon_sandbox::{Network, SandboxConfig};
use cordon_tools::{printable, printable_lines};

/// The sandbox a build's steps get (the builder sets their image and
/// workspace): `allow`'s network through the broker, none without it; the
/// limits given; the host's authorities with `host_certs`. Nothing of the
/// user's sandbox settings: a build is the same wherever it runs.
pub fn step_sandbox(
    workspace: &std::path::Path,
    allow: &[String],
    memory: u64,
    pids: u64,
    host_certs: bool,
) -> Result<SandboxConfig, String> {
    for a in allow {
        a.parse::<cordon_net::Entry>()
            .map_err(|why| format!("--allow {}: {why}", printable(a)))?;
    }
    let mut sandbox = SandboxConfig::new(workspace);
    sandbox
        .set_limits(cordon_sandbox::Limits::new(memory, pids, None, 1).map_err(|e| e.to_string())?);
    sandbox.host_certs = host_certs;
    sandbox.fork_supervisor = true;
    if !allow.is_empty() {
        sandbox.network = Network::Allow;
        sandbox.egress = Some(cordon_sandbox::Egress::new(cordon_net::PolicySpec {
            allow: allow.to_vec(),
            allow_private: false,
        }));
    }
    Ok(sandbox)
}

/// The image of `env` for the sandbox `c` will make (its workspace, limits
/// and `--host-certs`): made now if its inputs changed or it never was.
pub async fn prepare(store: &Store, env: &Environment, c: &SandboxConfig) -> Result<Image, String> {
    let credentials = Sources::from_env();
    let base = obtain(store, &env.image, &credentials, &|_| {})
        .await
        .map_err(|e| format!("the environment's image {}: {e}", printable(&env.image)))?;
    let mut dockerfile = format!("FROM {}\n", base.name);
    for input in &env.inputs {
        let line = serde_json::to_string(&[input.as_str(), &format!("/workspace/{input}")])
            .expect("strings serialise");
        dockerfile.push_str(&format!("COPY {line}\n"));
    }
    dockerfile.push_str("WORKDIR /workspace\n");
    let run = serde_json::to_string(&["/bin/sh", "-c", env.setup.as_str()]).expect("strings");
    dockerfile.push_str(&format!("RUN {run}\n"));

    let sandbox = step_sandbox(
        &c.workspace,
        &env.allow,
        c.memory.unwrap_or(2 << 30),
        c.pids.unwrap_or(1024),
        c.host_certs,
    )?;
    let builder = Builder {
        store,
        sandbox,
        credentials: &credentials,
        bases: None,
    };
    let opts = Options {
        context: c.workspace.clone(),
        dockerfile,
        tag: None,
        build_args: Vec::new(),
        target: None,
        no_cache: false,
        budget: 10 << 30,
        dockerignore: false,
        cache_scope: String::new(),
    };
    let setup = printable(env.setup.lines().next().unwrap_or_default());
    let show = move |e: Event| match e {
        Event::Step {
            cached: false,
            text,
            ..
        } if text.starts_with("RUN") => {
            eprintln!("cordon: setting up the environment, once: {setup}");
        }
        Event::Output(bytes) => show_output(&bytes),
        _ => {}
    };
    let built = builder.build(&opts, &show).await.map_err(|e| {
        format!(
            "the environment's setup: {}",
            printable_lines(&e.to_string())
        )
    })?;
    Ok(built.image)
}

pub(crate) fn open_store() -> Result<Store, String> {
    let root: PathBuf = store::default_root()
        .ok_or("neither CORDON_IMAGE_STORE nor HOME is set: nowhere to keep images")?;
    Store::open(&root).map_err(|e| e.to_string())
}

/// A build step's output on standard error, as text a terminal cannot
/// take for commands. Progress bars redraw a line with `\r`: each is a
/// new line here.
pub fn show_output(bytes: &[u8]) {
    use std::io::Write;
    let text = String::from_utf8_lossy(bytes)
        .replace("\r\n", "\n")
        .replace('\r', "\n");
    let text = cordon_tools::printable_lines(&text);
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Makes the root of `c` the image the settings name (`--image`,
/// `sandbox.image`, `CORDON_IMAGE`), pulling or importing it first when
/// the store lacks it, running as `user` or the image's own; returns the
/// image's working directory. Without an image, nothing changes.
pub async fn apply(
    c: &mut cordon_sandbox::SandboxConfig,
    settings: &crate::settings::Settings,
    user: Option<&str>,
) -> Result<Option<String>, String> {
    let resolved = settings.resolved();
    let environment = resolved.environment.clone();
    let Some(reference) = environment
        .as_ref()
        .map(|e| e.image.clone())
        .or(resolved.sandbox.image.clone())
    else {
        if user.is_some() {
            return Err("--user chooses a user of an image: give the image with --image".into());
        }
        return Ok(None);
    };
    let store = open_store()?;
    let image = match &environment {
        None => obtain(&store, &reference, &Sources::from_env(), &say)
            .await
            .map_err(|e| e.to_string())?,
        Some(env) => prepare(&store, env, c).await?,
    };
    let root = store
        .sandbox_root(&image, user)
        .map_err(|e| format!("{}: {e}", printable(&image.name)))?;
    let working_dir = root.working_dir.clone();
    c.image = Some(root.into());
    Ok(working_dir)
}

/// A pull's progress, on standard error.
pub(crate) fn say(step: Step) {
    match step {
        Step::Pulling { name } => eprintln!("cordon: pulling {}", printable(&name)),
        Step::Pull(Progress::Fetching { digest, size: n }) => {
            eprintln!("  fetching {} ({})", short(&digest.to_string()), size(n))
        }
        Step::Pull(Progress::Fetched { .. }) => {}
        Step::Pull(Progress::Present { digest }) => {
            eprintln!("  {} already here", short(&digest.to_string()))
        }
        Step::Pull(Progress::Unpacking) => eprintln!("  unpacking"),
    }
}

pub(crate) fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

pub(crate) fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
