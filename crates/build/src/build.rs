//! The builder: a Dockerfile's stages, one step after another, each `RUN`
//! in a sandbox of its own on the stage's image so far, each layer cached
//! by what made it.
//!
//! A step's cache key is a chain: the stage's base (an image's manifest
//! digest, another stage's key, or scratch), then every instruction as
//! expanded, and for `COPY` the content of every file it reads. A `RUN`'s
//! key also takes the build arguments it sees. A step whose key the store
//! has, with its layer still there, is not run again.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cordon_image::compose::Layer;
use cordon_image::store::Image;
use cordon_image::store::Store;
use cordon_sandbox::{BuildStep, ExecEvent, ExecRequest, RootImage, Sandbox, SandboxConfig};
use oci_spec::image::{ConfigBuilder, ImageConfiguration, ImageConfigurationBuilder};
use sha2::{Digest as _, Sha256};

use crate::cache;
use crate::context::{Context, Kind, Selected};
use crate::copy::{Origin, Owner, select_in_stage, write_copy};
use crate::dockerfile::{self, Command, Dockerfile, Op, Step};
use crate::expand;
use crate::view::View;

/// Lines of a failing step's output its error quotes.
const TAIL_LINES: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Dockerfile(String),
    #[error("line {line}: {what}")]
    Step { line: usize, what: String },
    #[error("line {line}: `{text}` exited with {code}\n{tail}")]
    Failed {
        line: usize,
        text: String,
        code: i32,
        tail: String,
    },
    #[error(transparent)]
    Store(#[from] cordon_image::store::StoreError),
}

fn step_err(line: usize) -> impl Fn(String) -> BuildError {
    move |what| BuildError::Step { line, what }
}

/// What a build is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    pub context: PathBuf,
    /// The Dockerfile's text (the CLI reads it, from the context or not).
    pub dockerfile: String,
    /// What the image is stored as; a name of the build's own when none.
    pub tag: Option<String>,
    pub build_args: Vec<(String, String)>,
    /// The stage to build; the last when none.
    pub target: Option<String>,
    pub no_cache: bool,
    /// Bytes one step may add: of context files a `COPY` takes, of
    /// files a `RUN` writes.
    pub budget: u64,
    /// Whether the context's `.dockerignore` applies (a setup's inputs are
    /// named one by one: it does not).
    pub dockerignore: bool,
    /// Whose cache the steps use: builds of different scopes (a server's
    /// tenants) never take each other's layers, since a step's layer is
    /// what its first run wrote, with that run's network.
    pub cache_scope: String,
}

/// What a build reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A stage begins from its base.
    Stage {
        index: usize,
        name: Option<String>,
        base: String,
    },
    /// A step begins; `cached` when its layer is the cache's.
    Step {
        line: usize,
        text: String,
        cached: bool,
    },
    /// Output of a running step.
    Output(Vec<u8>),
}

/// A finished build.
#[derive(Debug, Clone)]
pub struct Built {
    pub image: Image,
    /// Steps run, and taken from the cache.
    pub ran: usize,
    pub cached: usize,
}

/// The state of a stage so far.
#[derive(Clone)]
struct State {
    layers: Vec<Layer>,
    key: [u8; 32],
    env: Vec<(String, String)>,
    /// The stage's arguments: a value, or none (declared, never given).
    args: BTreeMap<String, Option<String>>,
    workdir: String,
    user: String,
    labels: BTreeMap<String, String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    /// Whether this stage set `CMD` (an `ENTRYPOINT` then keeps it).
    cmd_set: bool,
    ports: BTreeMap<String, ()>,
    base_config: Option<ImageConfiguration>,
}

pub struct Builder<'a> {
    pub store: &'a Store,
    /// The sandbox every `RUN` gets: its network, limits and backend (the
    /// image and workspace are the builder's).
    pub sandbox: SandboxConfig,
    pub credentials: &'a cordon_image::auth::Sources,
    /// What a `FROM` (or `COPY --from`) naming an image may reach: the
    /// name made the source to obtain, or why it is refused. None: any
    /// reference, as written (the user's own build).
    pub bases: Option<&'a Bases>,
}

/// See [`Builder::bases`].
pub type Bases = dyn Fn(&str) -> Result<String, String> + Send + Sync;

impl Builder<'_> {
    pub async fn build(
        &self,
        opts: &Options,
        events: &(dyn Fn(Event) + Send + Sync),
    ) -> Result<Built, BuildError> {
        // Checked before any step runs; kept as typed (`--image` finds it
        // by that name at once, where a parse costs the reference
        // grammar's regex in every process).
        let tag = opts.tag.as_deref().map(tag_name).transpose()?;
        let file = dockerfile::parse(&opts.dockerfile)
            .map_err(|e| BuildError::Dockerfile(e.to_string()))?;
        let context = if opts.dockerignore {
            Context::open(&opts.context)
        } else {
            Context::open_plain(&opts.context)
        }
        .map_err(|e| BuildError::Dockerfile(format!("the build context: {e}")))?;
        let cli_args: BTreeMap<String, String> = opts.build_args.iter().cloned().collect();
        let mut globals = BTreeMap::new();
        for step in &file.global_args {
            if let Op::Arg(raw) = &step.op {
                let lookup = |k: &str| globals.get(k).cloned();
                let pairs = expand::arg_pairs(raw, file.escape, &lookup)
                    .map_err(|e| step_err(step.line)(e.to_string()))?;
                for (k, v) in pairs {
                    let v = cli_args.get(&k).cloned().or(v).unwrap_or_default();
                    globals.insert(k, v);
                }
            }
        }
        let last = match &opts.target {
            None => file.stages.len() - 1,
            Some(t) => stage_index(&file, &t.to_lowercase()).ok_or_else(|| {
                BuildError::Dockerfile(format!("--target {t}: no stage has that name"))
            })?,
        };
        let mut run = Run {
            builder: self,
            opts,
            file: &file,
            context: &context,
            cli_args: &cli_args,
            globals: &globals,
            events,
            done: BTreeMap::new(),
            current: 0,
            ran: 0,
            cached: 0,
        };
        let state = run.stage(last).await?;
        let (ran, cached) = (run.ran, run.cached);
        let name = match tag {
            Some(t) => t,
            None => format!("localhost/cordon-build:{}", &hex::encode(state.key)[..12]),
        };
        let config = image_config(&state)?;
        let image = self.store.put_image(&name, config, &state.layers)?;
        Ok(Built { image, ran, cached })
    }
}

/// `-t`'s name, if it is one a reference may have: plain lowercase names
/// pass at once, anything else through the reference grammar.
fn tag_name(t: &str) -> Result<String, BuildError> {
    let plain = !t.is_empty()
        && t.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'.' | b'_' | b'-' | b'/' | b':')
        })
        && !t.starts_with(['/', ':', '.', '-'])
        && t.matches(':').count() <= 1;
    if plain {
        return Ok(t.to_string());
    }
    t.parse::<cordon_image::ImageRef>()
        .map(|r| r.to_string())
        .map_err(|e| BuildError::Dockerfile(format!("-t {t}: {e}")))
}

fn stage_index(file: &Dockerfile, name: &str) -> Option<usize> {
    file.stages
        .iter()
        .position(|s| s.name.as_deref() == Some(name))
        .or_else(|| name.parse().ok().filter(|&i: &usize| i < file.stages.len()))
}

struct Run<'r, 'b> {
    builder: &'r Builder<'b>,
    opts: &'r Options,
    file: &'r Dockerfile,
    context: &'r Context,
    cli_args: &'r BTreeMap<String, String>,
    globals: &'r BTreeMap<String, String>,
    events: &'r (dyn Fn(Event) + Send + Sync),
    done: BTreeMap<usize, State>,
    /// The stage whose steps run (a `COPY --from` names one before it).
    current: usize,
    ran: usize,
    cached: usize,
}

impl Run<'_, '_> {
    /// Builds stage `index` (and the stages it needs first).
    fn stage<'s>(
        &'s mut self,
        index: usize,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<State, BuildError>> + Send + 's>> {
        Box::pin(async move {
            if let Some(s) = self.done.get(&index) {
                return Ok(s.clone());
            }
            let stage = &self.file.stages[index];
            let globals = self.globals.clone();
            let lookup = move |k: &str| globals.get(k).cloned();
            // The stages this one copies from are built first, so that
            // the progress reads in the order the work is done.
            for step in &stage.steps {
                if let Op::Copy(c) = &step.op
                    && let Some(raw) = &c.from
                    && let Ok(name) = expand::word(raw, self.file.escape, &lookup)
                    && let Some(i) = stage_index(self.file, &name.to_lowercase())
                    && i < index
                {
                    self.stage(i).await?;
                }
            }
            let base = expand::word(&stage.image, self.file.escape, &lookup)
                .map_err(|e| step_err(stage.line)(e.to_string()))?;
            let parent = match stage_index(self.file, &base.to_lowercase()) {
                Some(i) if i < index && self.file.stages[i].name.is_some() => {
                    Some(self.stage(i).await?)
                }
                _ => None,
            };
            (self.events)(Event::Stage {
                index,
                name: stage.name.clone(),
                base: base.clone(),
            });
            let mut state = match parent {
                Some(p) => p,
                None if base == "scratch" => {
                    State::new(hash(&[b"scratch", self.opts.cache_scope.as_bytes()]))
                }
                None => self.base_image(&base, stage.line).await?,
            };
            let outer = std::mem::replace(&mut self.current, index);
            for step in &stage.steps {
                self.step(&mut state, step).await?;
            }
            self.current = outer;
            self.done.insert(index, state.clone());
            Ok(state)
        })
    }

    async fn base_image(&self, reference: &str, line: usize) -> Result<State, BuildError> {
        let source = match self.builder.bases {
            Some(bases) => bases(reference)
                .map_err(|why| step_err(line)(format!("FROM {reference}: {why}")))?,
            None => reference.to_string(),
        };
        let image = cordon_image::obtain::obtain(
            self.builder.store,
            &source,
            self.builder.credentials,
            &|_| {},
        )
        .await
        .map_err(|e| step_err(line)(format!("FROM {reference}: {e}")))?;
        let store = self.builder.store;
        let config = store.config_of(&image)?;
        let mut state = State::new(hash(&[
            b"image",
            image.manifest.to_string().as_bytes(),
            self.opts.cache_scope.as_bytes(),
        ]));
        state.layers = store.layers_of(&image)?;
        if let Some(c) = config.config() {
            state.env = c
                .env()
                .iter()
                .flatten()
                .filter_map(|e| {
                    let (k, v) = e.split_once('=')?;
                    Some((k.to_string(), v.to_string()))
                })
                .collect();
            state.workdir = c.working_dir().clone().unwrap_or_default();
            state.user = c.user().clone().unwrap_or_default();
            state.labels = c.labels().clone().unwrap_or_default().into_iter().collect();
            state.entrypoint = c.entrypoint().clone();
            state.cmd = c.cmd().clone();
            state.ports = c
                .exposed_ports()
                .iter()
                .flatten()
                .map(|p| (p.clone(), ()))
                .collect();
        }
        state.base_config = Some(config);
        Ok(state)
    }

    async fn step(&mut self, state: &mut State, step: &Step) -> Result<(), BuildError> {
        let escape = self.file.escape;
        let err = step_err(step.line);
        let vars = {
            let env = state.env.clone();
            let args = state.args.clone();
            move |k: &str| {
                env.iter()
                    .rev()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.clone())
                    .or_else(|| args.get(k).cloned().flatten())
            }
        };
        let ex = |e: expand::ExpandError| err(e.to_string());
        match &step.op {
            Op::Env(raw) => {
                for (k, v) in expand::pairs(raw, escape, &vars).map_err(ex)? {
                    state.env.retain(|(n, _)| *n != k);
                    state.env.push((k, v));
                }
                state.chain(&["ENV", &format!("{:?}", state.env)]);
            }
            Op::Arg(raw) => {
                for (k, v) in expand::arg_pairs(raw, escape, &vars).map_err(ex)? {
                    let v = self
                        .cli_args
                        .get(&k)
                        .cloned()
                        .or(v)
                        .or_else(|| self.globals.get(&k).cloned());
                    state.args.insert(k, v);
                }
            }
            Op::Label(raw) => {
                state
                    .labels
                    .extend(expand::pairs(raw, escape, &vars).map_err(ex)?);
            }
            Op::Workdir(raw) => {
                let dir = expand::word(raw, escape, &vars).map_err(ex)?;
                state.workdir = absolute(&state.workdir, &dir);
                let w = state.workdir.clone();
                state.chain(&["WORKDIR", &w]);
                self.make_workdir(state, step)?;
            }
            Op::User(raw) => {
                state.user = expand::word(raw, escape, &vars).map_err(ex)?;
                let u = state.user.clone();
                state.chain(&["USER", &u]);
            }
            Op::Expose(raw) => {
                for p in raw {
                    let p = expand::word(p, escape, &vars).map_err(ex)?;
                    let p = if p.contains('/') {
                        p
                    } else {
                        format!("{p}/tcp")
                    };
                    state.ports.insert(p, ());
                }
            }
            Op::Entrypoint(c) => {
                state.entrypoint = Some(argv(c));
                // As Docker: a new entry point drops the base's command.
                if !state.cmd_set {
                    state.cmd = None;
                }
            }
            Op::Cmd(c) => {
                state.cmd = Some(argv(c));
                state.cmd_set = true;
            }
            Op::Run(c) => self.run(state, step, c).await?,
            Op::Copy(c) => self.copy(state, step, c, &vars).await?,
        }
        Ok(())
    }

    /// Takes the layer the cache has for `key`, reporting the step.
    fn cached(&mut self, state: &mut State, step: &Step, key: [u8; 32]) -> bool {
        let layer = (!self.opts.no_cache)
            .then(|| cache::get(self.builder.store, &key))
            .flatten();
        (self.events)(Event::Step {
            line: step.line,
            text: step.text.clone(),
            cached: layer.is_some(),
        });
        match layer {
            Some(layer) => {
                state.layers.push(layer);
                state.key = key;
                self.cached += 1;
                true
            }
            None => false,
        }
    }

    async fn run(&mut self, state: &mut State, step: &Step, c: &Command) -> Result<(), BuildError> {
        let err = step_err(step.line);
        let args: Vec<String> = state
            .args
            .iter()
            .filter_map(|(k, v)| Some(format!("{k}={}", v.as_ref()?)))
            .collect();
        let key = state.next_key(&["RUN", &step.text, &args.join("\n")]);
        if self.cached(state, step, key) {
            return Ok(());
        }
        let store = self.builder.store;
        let layers = layer_dirs(store, &state.layers);
        let (uid, gid) = cordon_image::root::resolve_user(&layers, &state.user)
            .map_err(|e| err(format!("USER {}: {e}", state.user)))?;
        let workspace = tempfile::tempdir().map_err(|e| err(e.to_string()))?;
        let changes = tempfile::NamedTempFile::new_in(store.root().join("tmp"))
            .map_err(|e| err(format!("a file for the step's changes: {e}")))?;
        let view = View::open(&layers).map_err(|e| err(e.to_string()))?;
        let build_step = BuildStep {
            changes: changes.path().to_path_buf(),
            skip: crate::commit::generated_paths(&view),
        };
        let status = build_step.status();
        let _status_file = tempfile::TempPath::try_from_path(&status)
            .map_err(|e| err(format!("the step's status file: {e}")))?;
        let mut config: SandboxConfig = self.builder.sandbox.clone();
        config.workspace = workspace.path().to_path_buf();
        config.image = Some(RootImage {
            layers,
            scratch: store.root().join("run"),
            flat: store.flat_dir(),
            uid,
            gid,
            env: Vec::new(),
            manifest: None,
            label: None,
            step: Some(build_step),
            upper_from: None,
        });
        // The image's environment, then the arguments the step sees.
        let mut env = state.env.clone();
        for (k, v) in &state.args {
            if let Some(v) = v
                && !env.iter().any(|(n, _)| n == k)
            {
                env.push((k.clone(), v.clone()));
            }
        }
        config.env = env;
        // What a step may write: a layer is disk on the host, and a
        // package's scripts are not the user's to trust.
        config.disk = Some(self.opts.budget);
        let sandbox = Sandbox::create(config)
            .await
            .map_err(|e| err(format!("starting the step's sandbox: {e}")))?;
        let outcome = self.exec(&sandbox, state, step, c).await;
        // Its supervisor writes the layer once every process is gone.
        sandbox.close_step(STEP_WRITE_LIMIT).await;
        outcome?;
        let said = std::fs::read_to_string(&status).unwrap_or_default();
        if said != "ok" {
            return Err(err(format!(
                "writing the step's changes: {}",
                if said.is_empty() {
                    "the step's supervisor did not finish".to_string()
                } else {
                    said
                }
            )));
        }
        let layer = blocking(|| {
            let mut w = store.layer_writer()?;
            std::io::copy(
                &mut changes.reopen().map_err(|e| err(e.to_string()))?,
                &mut w,
            )
            .map_err(|e| err(format!("storing the step's changes: {e}")))?;
            Ok::<_, BuildError>(w.finish()?)
        })?;
        self.add_layer(state, key, layer);
        Ok(())
    }

    async fn exec(
        &self,
        sandbox: &Sandbox,
        state: &State,
        step: &Step,
        c: &Command,
    ) -> Result<(), BuildError> {
        let err = step_err(step.line);
        let mut req = ExecRequest::argv(argv(c));
        req.cwd = Some(if state.workdir.is_empty() {
            "/".into()
        } else {
            state.workdir.clone()
        });
        let mut exec = sandbox
            .exec_stream(req)
            .await
            .map_err(|e| err(format!("starting the step: {e}")))?;
        let mut tail: Vec<u8> = Vec::new();
        let over_budget = || {
            err(format!(
                "`{}` wrote more than the build's budget ({} bytes; see --disk)",
                step.text, self.opts.budget
            ))
        };
        while let Some(ev) = exec.next().await {
            // The budget's stop may end the stream before its exit does:
            // one reason, whichever comes first.
            let ev = match ev {
                Err(cordon_sandbox::Error::DiskBudget(_)) => return Err(over_budget()),
                ev => ev.map_err(|e| err(e.to_string()))?,
            };
            match ev {
                ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => {
                    tail.extend_from_slice(&b);
                    if tail.len() > 64 << 10 {
                        tail.drain(..tail.len() - (32 << 10));
                    }
                    (self.events)(Event::Output(b));
                }
                ExecEvent::Exit(r) => {
                    let code = r.exit_code();
                    if code == 0 {
                        return Ok(());
                    }
                    if r.disk_exceeded || sandbox.disk_stopped().is_some() {
                        return Err(over_budget());
                    }
                    let text = String::from_utf8_lossy(&tail);
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
                    return Err(BuildError::Failed {
                        line: step.line,
                        text: step.text.clone(),
                        code,
                        tail: tail
                            .chars()
                            .filter(|&c| !cordon_image::text::unprintable(c) || c == '\n')
                            .collect(),
                    });
                }
            }
        }
        Err(err("the step's sandbox ended without an exit status".into()))
    }

    async fn copy(
        &mut self,
        state: &mut State,
        step: &Step,
        c: &dockerfile::Copy,
        vars: &(dyn Fn(&str) -> Option<String> + Send + Sync),
    ) -> Result<(), BuildError> {
        let err = step_err(step.line);
        let escape = self.file.escape;
        let ex = |e: expand::ExpandError| err(e.to_string());
        let store = self.builder.store;
        let dest = expand::word(&c.dest, escape, vars).map_err(ex)?;
        let mut dest_abs = absolute(&state.workdir, &dest);
        if dest.ends_with('/') && !dest_abs.ends_with('/') {
            dest_abs.push('/');
        }
        let chown = match &c.chown {
            Some(raw) => Some(expand::word(raw, escape, vars).map_err(ex)?),
            None => None,
        };
        let chmod = match &c.chmod {
            Some(raw) => {
                let m = expand::word(raw, escape, vars).map_err(ex)?;
                Some(
                    u32::from_str_radix(&m, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| err(format!("--chmod={m}: not an octal mode")))?,
                )
            }
            None => None,
        };
        let layers = layer_dirs(store, &state.layers);
        let ids = match &chown {
            Some(u) => Some(
                cordon_image::root::resolve_user(&layers, u)
                    .map_err(|e| err(format!("--chown={u}: {e}")))?,
            ),
            None => None,
        };
        let mut sources_raw = Vec::new();
        for s in &c.sources {
            let s = expand::word(s, escape, vars).map_err(ex)?;
            if c.add && dockerfile::is_remote(&s) {
                return Err(err(format!(
                    "ADD {s}: fetching is not supported; fetch it in a RUN with --allow"
                )));
            }
            sources_raw.push(s);
        }
        // Where the sources come from, and what names their content.
        let mut from_state = None;
        let mut key_parts: Vec<String> = vec![
            "COPY".into(),
            step.text.clone(),
            dest_abs.clone(),
            format!("{chown:?} {chmod:?}"),
        ];
        let selected: Vec<Selected> = match &c.from {
            None => {
                let mut all = Vec::new();
                for s in &sources_raw {
                    all.extend(
                        self.context
                            .select(s, self.opts.budget)
                            .map_err(|e| err(e.to_string()))?,
                    );
                }
                for sel in &all {
                    for e in &sel.entries {
                        key_parts.push(content_line(e));
                    }
                }
                all
            }
            Some(raw) => {
                let name = expand::word(raw, escape, vars).map_err(ex)?;
                let src = match stage_index(self.file, &name.to_lowercase()) {
                    Some(i) if i < self.current => self.stage(i).await?,
                    // Itself or one after it: a loop, not a dependency.
                    Some(_) => {
                        return Err(err(format!(
                            "COPY --from={name}: a stage copies only from one before it"
                        )));
                    }
                    None => self.base_image(&name, step.line).await?,
                };
                key_parts.push(hex::encode(src.key));
                let view =
                    View::open(&layer_dirs(store, &src.layers)).map_err(|e| err(e.to_string()))?;
                let mut all = Vec::new();
                for s in &sources_raw {
                    all.push(select_in_stage(&view, s).map_err(|e| err(e.to_string()))?);
                }
                from_state = Some(view);
                all
            }
        };
        let parts: Vec<&str> = key_parts.iter().map(String::as_str).collect();
        let key = state.next_key(&parts);
        if self.cached(state, step, key) {
            return Ok(());
        }
        let view = View::open(&layers).map_err(|e| err(e.to_string()))?;
        let origin = match &from_state {
            Some(v) => Origin::Stage(v),
            None => Origin::Context(self.context),
        };
        // ADD unpacks a local archive where COPY copies it: into a
        // directory of its own first, by the store's rules for layers
        // (nothing in it is followed out), then copied from there.
        let mut unpacked = Vec::new();
        if c.add && from_state.is_none() {
            for (i, sel) in selected.iter().enumerate() {
                if let [e] = sel.entries.as_slice()
                    && !sel.dir
                    && matches!(e.kind, Kind::File { .. })
                    && let Some(dir) = self.unpack_archive(&e.path, step.line)?
                {
                    unpacked.push((i, dir));
                }
            }
        }
        let extracted: Vec<(usize, Origin<'_>, Selected)> = unpacked
            .iter()
            .map(|(i, (_, ctx, sel))| (*i, Origin::Context(ctx), sel.clone()))
            .collect();
        let sources: Vec<(&Origin<'_>, &Selected)> = selected
            .iter()
            .enumerate()
            .map(
                |(i, sel)| match extracted.iter().find(|(j, _, _)| *j == i) {
                    Some((_, o, s)) => (o, s),
                    None => (&origin, sel),
                },
            )
            .collect();
        let layer = blocking(|| {
            let mut w = store.layer_writer()?;
            write_copy(&mut w, &view, &sources, &dest_abs, &Owner { ids, chmod })
                .map_err(|e| err(e.to_string()))?;
            Ok::<_, BuildError>(w.finish()?)
        })?;
        self.add_layer(state, key, layer);
        Ok(())
    }

    /// Puts a layer a step made on the stage, and in the cache.
    fn add_layer(&mut self, state: &mut State, key: [u8; 32], layer: Layer) {
        cache::put(self.builder.store, &key, &layer);
        state.layers.push(layer);
        state.key = key;
        self.ran += 1;
    }

    /// Makes the working directory when the image lacks it, as Docker
    /// does: a layer of it (and its parents), owned by the stage's user.
    fn make_workdir(&mut self, state: &mut State, step: &Step) -> Result<(), BuildError> {
        let err = step_err(step.line);
        let store = self.builder.store;
        let layers = layer_dirs(store, &state.layers);
        let view = View::open(&layers).map_err(|e| err(e.to_string()))?;
        let real = view
            .resolve(state.workdir.as_bytes(), true)
            .map_err(|e| err(e.to_string()))?;
        if view.find(&real).is_some() {
            return Ok(());
        }
        let ids = cordon_image::root::resolve_user(&layers, &state.user)
            .map_err(|e| err(format!("USER {}: {e}", state.user)))?;
        let key = state.next_key(&["MKDIR", &state.workdir, &format!("{ids:?}")]);
        if self.cached(state, step, key) {
            return Ok(());
        }
        let mut w = store.layer_writer()?;
        let dest = format!("{}/", state.workdir.trim_end_matches('/'));
        let owner = Owner {
            ids: Some(ids),
            chmod: None,
        };
        write_copy(&mut w, &view, &[], &dest, &owner).map_err(|e| err(e.to_string()))?;
        let layer = w.finish()?;
        self.add_layer(state, key, layer);
        Ok(())
    }

    /// The context file at `path` unpacked, when it is an archive: the
    /// directory, the context of it, and everything in it as a source.
    fn unpack_archive(
        &self,
        path: &[u8],
        line: usize,
    ) -> Result<Option<(tempfile::TempDir, Context, Selected)>, BuildError> {
        use std::io::Read;
        let err = step_err(line);
        let mut head = Vec::new();
        self.context
            .open_file(path)
            .map_err(|e| err(e.to_string()))?
            .take(512)
            .read_to_end(&mut head)
            .map_err(|e| err(e.to_string()))?;
        if !crate::copy::is_archive(&head).map_err(|e| err(e.to_string()))? {
            return Ok(None);
        }
        let dir = tempfile::Builder::new()
            .prefix("add-")
            .tempdir_in(self.builder.store.root().join("tmp"))
            .map_err(|e| err(e.to_string()))?;
        let file = self
            .context
            .open_file(path)
            .map_err(|e| err(e.to_string()))?;
        let limits = cordon_image::Limits {
            max_bytes: self.opts.budget,
            ..cordon_image::Limits::default()
        };
        cordon_image::unpack(
            std::io::BufReader::new(file),
            dir.path(),
            limits,
            cordon_image::Owners::Caller,
        )
        .map_err(|e| err(format!("ADD {}: {e}", crate::view::shown(path))))?;
        let ctx = Context::open_plain(dir.path()).map_err(|e| err(e.to_string()))?;
        let mut sel = ctx
            .select(".", self.opts.budget)
            .map_err(|e| err(e.to_string()))?;
        let sel = sel.pop().ok_or_else(|| err("an empty archive".into()))?;
        Ok(Some((dir, ctx, sel)))
    }
}

/// Runs `f`, which blocks (a layer written and unpacked, seconds for a
/// large one), so that the runtime's other tasks go on meanwhile: a server
/// runs builds beside its API. A single-threaded runtime (a test's) has no
/// other worker to hand them to.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The unpacked layers' directories of `layers` (bottom first), top first
/// as a sandbox and a view stack them.
fn layer_dirs(store: &Store, layers: &[Layer]) -> Vec<PathBuf> {
    layers
        .iter()
        .rev()
        .map(|l| store.layer_dir(&l.diff_id))
        .collect()
}

/// How long a step's supervisor may take to write its layer once its
/// processes are gone.
const STEP_WRITE_LIMIT: std::time::Duration = std::time::Duration::from_secs(3600);

impl State {
    fn new(key: [u8; 32]) -> State {
        State {
            layers: Vec::new(),
            key,
            env: Vec::new(),
            args: BTreeMap::new(),
            workdir: String::new(),
            user: String::new(),
            labels: BTreeMap::new(),
            entrypoint: None,
            cmd: None,
            cmd_set: false,
            ports: BTreeMap::new(),
            base_config: None,
        }
    }

    fn next_key(&self, parts: &[&str]) -> [u8; 32] {
        let mut all: Vec<&[u8]> = vec![&self.key];
        all.extend(parts.iter().map(|p| p.as_bytes()));
        hash(&all)
    }

    fn chain(&mut self, parts: &[&str]) {
        self.key = self.next_key(parts);
    }
}

fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

fn content_line(e: &crate::context::Entry) -> String {
    let what = match &e.kind {
        Kind::File { size, digest } => format!("f {size} {}", hex::encode(digest)),
        Kind::Dir => "d".into(),
        Kind::Link { target } => format!("l {}", hex::encode(target)),
    };
    format!("{} {:o} {what}", hex::encode(&e.rel), e.mode)
}

fn argv(c: &Command) -> Vec<String> {
    match c {
        Command::Exec(v) => v.clone(),
        Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
    }
}

/// `path` made absolute against the working directory `cwd`, cleaned.
fn absolute(cwd: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", if cwd.is_empty() { "" } else { cwd })
    };
    let mut out: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    format!("/{}", out.join("/"))
}

fn image_config(state: &State) -> Result<ImageConfiguration, BuildError> {
    let bad = |e: oci_spec::OciSpecError| BuildError::Dockerfile(e.to_string());
    let mut c = ConfigBuilder::default()
        .env(
            state
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
        )
        .labels(
            state
                .labels
                .clone()
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
        );
    if !state.workdir.is_empty() {
        c = c.working_dir(state.workdir.clone());
    }
    if !state.user.is_empty() {
        c = c.user(state.user.clone());
    }
    if let Some(e) = &state.entrypoint {
        c = c.entrypoint(e.clone());
    }
    if let Some(cmd) = &state.cmd {
        c = c.cmd(cmd.clone());
    }
    if !state.ports.is_empty() {
        c = c.exposed_ports(state.ports.keys().cloned().collect::<Vec<_>>());
    }
    let config = c.build().map_err(bad)?;
    let base = state.base_config.as_ref();
    ImageConfigurationBuilder::default()
        .architecture(
            base.map(|b| b.architecture().clone())
                .unwrap_or_else(|| cordon_image::store::platform_arch().into()),
        )
        .os(base
            .map(|b| b.os().clone())
            .unwrap_or_else(|| "linux".into()))
        .config(config)
        .build()
        .map_err(bad)
}
