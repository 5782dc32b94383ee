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

use crate::settings::Environment;
use cordon_build::{Builder, Event, Options};
use cordon_image::auth::Sources;
use cordon_image::obtain::obtain;
use cordon_image::store::{Image, Store};
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
        Event::Output(bytes) => crate::image_cmd::show_output(&bytes),
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
