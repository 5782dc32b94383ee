//! `cordon image build` as a user types it, as root and as an unprivileged
//! caller: a multi-stage Dockerfile with every instruction cordon takes,
//! built, rebuilt from the cache, run; the errors a user meets (a step
//! that fails, an instruction cordon does not take); and the context as an
//! attacker wrote it (a link out, a path out, a file past the budget).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use cordon_testkit::oci::{busybox_layer, write_image};
use serde_json::json;

/// A busybox base image at `oci:DIR:v1`, a store, and a build context,
/// all the run's user's own.
struct Build {
    base: String,
    store: PathBuf,
    context: PathBuf,
}

fn setup(t: &Ctx, files: &[(&str, &str)]) -> Build {
    let layout = t.dir().join("base");
    write_image(
        &layout,
        "v1",
        &[busybox_layer()],
        json!({"Env": ["PATH=/bin", "FROM_BASE=yes"], "Cmd": ["sh"]}),
    );
    let store = t.dir().join("store");
    let context = t.dir().join("context");
    fs::create_dir_all(&store).unwrap();
    for (path, body) in files {
        let p = context.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, body).unwrap();
    }
    fs::create_dir_all(&context).unwrap();
    if !t.root() {
        for p in [&layout, &store, &context] {
            chown_tree(p, NOBODY);
        }
    }
    Build {
        base: format!("oci:{}:v1", layout.display()),
        store,
        context,
    }
}

fn chown_tree(p: &Path, id: u32) {
    std::os::unix::fs::lchown(p, Some(id), Some(id)).unwrap();
    if p.is_dir() && !p.is_symlink() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), id);
        }
    }
}

impl Build {
    fn env(&self) -> [(&str, &str); 1] {
        [("CORDON_IMAGE_STORE", self.store.to_str().unwrap())]
    }

    /// `cordon image build ARGS CONTEXT`, the base image given as BASE.
    fn build(&self, t: &Ctx, args: &[&str]) -> Out {
        let mut all = vec!["image", "build", "--build-arg"];
        let base = format!("BASE={}", self.base);
        all.push(&base);
        all.extend_from_slice(args);
        let ctx = self.context.to_str().unwrap().to_string();
        all.push(&ctx);
        t.cordon_out(&all, &self.env(), t.within(Duration::from_secs(120)))
    }

    fn run(&self, t: &Ctx, image: &str, script: &str) -> Out {
        self.run_with(t, &["--image", image], script)
    }

    fn run_with(&self, t: &Ctx, opts: &[&str], script: &str) -> Out {
        t.run_env(
            &self.env(),
            opts,
            &["sh", "-c", script],
            t.within(Duration::from_secs(60)),
        )
    }

    /// What builds left in the store's directory of writable layers.
    fn leftovers(&self) -> Vec<String> {
        fs::read_dir(self.store.join("run"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn dockerfile(&self, text: &str) {
        let p = self.context.join("Dockerfile");
        fs::write(&p, dedent(text)).unwrap();
        std::os::unix::fs::lchown(&p, Some(self.owner()), Some(self.owner())).unwrap();
    }

    fn owner(&self) -> u32 {
        std::fs::metadata(&self.context)
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap()
    }
}

const MULTI_STAGE: &str = r#"
    ARG BASE
    FROM ${BASE} AS builder
    ARG GREETING=hello
    ENV APP=/app
    WORKDIR $APP
    COPY --chmod=755 hello.sh ./
    COPY data/ ./data/
    RUN ./hello.sh > built.txt && echo "$GREETING from $APP" >> built.txt \
     && rm data/drop.txt && mkdir -p /var/cache/made && echo kept > /tmp/kept
    ADD notes.txt /app/notes/

    FROM $BASE
    LABEL org.example.name="cordon test" version=1
    COPY --from=builder --chown=1000:1000 /app /srv/app
    COPY --from=builder /tmp/kept /srv/kept
    RUN ["/bin/sh", "-c", "rm /etc/os-release && adduser -D -u 1000 app 2>/dev/null || echo 'app:x:1000:1000::/srv:/bin/sh' >> /etc/passwd"]
    RUN mkdir -p /var/private && echo hidden > /var/private/f && chmod 600 /var/private/f \
     && chown -R 42:42 /var/private && chmod 700 /var/private
    USER app
    WORKDIR /srv/work
    EXPOSE 8080
    ENTRYPOINT ["/bin/sh", "-c"]
    CMD ["cat /srv/app/built.txt"]
"#;

/// Every instruction, two stages, built, run, and built again from the
/// cache in well under a second.
fn multi_stage_builds_runs_and_caches(t: &Ctx) {
    let b = setup(
        t,
        &[
            ("hello.sh", "#!/bin/sh\necho built by hello.sh\n"),
            ("data/keep.txt", "keep me\n"),
            ("data/drop.txt", "drop me\n"),
            ("notes.txt", "some notes\n"),
        ],
    );
    b.dockerfile(MULTI_STAGE);
    let out = b.build(t, &["-t", "test/built:1", "--build-arg", "GREETING=hi"]);
    out.code(0).stdout_has("test/built:1 sha256:");
    for step in [
        "RUN ./hello.sh",
        "COPY --from=builder --chown=1000:1000 /app /srv/app",
    ] {
        assert!(
            out.stderr.contains(step),
            "{step} not shown:\n{}",
            out.stderr
        );
    }
    assert!(out.stderr.contains("built by hello.sh") || out.stderr.contains("built in"));

    let ran = b.run(
        t,
        "test/built:1",
        "cat /srv/app/built.txt; ls /srv/app/data; cat /srv/app/notes/notes.txt; \
         cat /srv/kept; id -u; stat -c '%u:%g %a' /srv/app/hello.sh; \
         test -e /etc/os-release || echo os-release-gone; echo FROM_BASE=$FROM_BASE; \
         ls -d /var/cache/made 2>&1; pwd; stat -c 'workdir %u' /srv/work",
    );
    ran.code(0)
        .line("built by hello.sh")
        .line("hi from /app")
        .line("keep.txt")
        .lacks("drop.txt")
        .line("some notes")
        .line("kept")
        .line("1000")
        // An unprivileged caller's store keeps every file as its own, so
        // root's inside (docs/images.md); the image's blob keeps 1000.
        .line(t.pick("1000:1000 755", "0:0 755"))
        .line("os-release-gone")
        .line("FROM_BASE=yes")
        // The first stage's RUN made it; the final stage never had it.
        .stdout_has("No such file")
        // WORKDIR made it, the user's, and runs start there.
        .line("/srv/work")
        .line(t.pick("workdir 1000", "workdir 0"));

    // A step's files of another user, unreadable to the caller on the
    // host, are in its layer all the same (its supervisor writes the layer
    // in the sandbox's namespace), and the steps leave nothing behind.
    b.run_with(
        t,
        &["--image", "test/built:1", "--user", "0"],
        "cat /var/private/f; stat -c 'private %u %a' /var/private/f",
    )
    .code(0)
    .line("hidden")
    .line(t.pick("private 42 600", "private 0 600"));
    assert!(b.leftovers().is_empty(), "{:?}", b.leftovers());

    // Unchanged: every step from the cache, well under a second.
    let again = b.build(t, &["-t", "test/built:1", "--build-arg", "GREETING=hi"]);
    again.code(0).stderr_has("0 steps run");
    let took = seconds(&again.stderr);
    assert!(
        took < 1.0,
        "a cached rebuild took {took} s:\n{}",
        again.stderr
    );

    // A changed input runs what reads it, and what follows.
    fs::write(b.context.join("data/keep.txt"), "changed\n").unwrap();
    let changed = b.build(t, &["-t", "test/built:1", "--build-arg", "GREETING=hi"]);
    changed.code(0);
    assert!(
        !changed.stderr.contains("0 steps run"),
        "{}",
        changed.stderr
    );
    b.run(t, "test/built:1", "cat /srv/app/data/keep.txt")
        .code(0)
        .line("changed");

    // --no-cache runs everything.
    b.build(
        t,
        &[
            "-t",
            "test/built:1",
            "--no-cache",
            "--build-arg",
            "GREETING=hi",
        ],
    )
    .code(0)
    .stderr_has(" 0 cached");
}
attack!(multi_stage_builds_runs_and_caches, native);

fn seconds(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("built in "))
        .unwrap_or_else(|| panic!("no `built in` line:\n{stderr}"));
    line["built in ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `.dockerignore` keeps files out of a `COPY .`.
fn dockerignore_keeps_files_out(t: &Ctx) {
    let b = setup(
        t,
        &[
            ("app.txt", "app\n"),
            ("secret.env", "TOKEN=1\n"),
            ("logs/a.log", "log\n"),
            ("logs/keep.log", "kept log\n"),
            (".dockerignore", "*.env\nlogs\n!logs/keep.log\n"),
        ],
    );
    b.dockerfile("ARG BASE\nFROM $BASE\nCOPY . /ctx/\n");
    b.build(t, &["-t", "test/ignored"]).code(0);
    b.run(t, "test/ignored", "cd /ctx && find . -type f | sort")
        .code(0)
        .line("./app.txt")
        .line("./logs/keep.log")
        .lacks("secret.env")
        .lacks("a.log");
}
attack!(dockerignore_keeps_files_out, native);

/// What a user gets wrong is said with its line, and nothing is stored.
fn bad_dockerfiles_are_refused_by_line(t: &Ctx) {
    let b = setup(t, &[]);
    b.dockerfile("ARG BASE\nFROM $BASE\nHEALTHCHECK CMD true\n");
    b.build(t, &["-t", "test/bad"])
        .code(1)
        .stderr_has("line 3")
        .stderr_has("HEALTHCHECK");
    b.dockerfile("ARG BASE\nFROM $BASE\nRUN echo first line; echo last words >&2; exit 7\n");
    b.build(t, &["-t", "test/bad"])
        .code(1)
        .stderr_has("line 3")
        .stderr_has("exited with 7")
        .stderr_has("last words");
    b.dockerfile("ARG BASE\nFROM $BASE\nRUN --mount=type=cache,target=/x true\n");
    b.build(t, &["-t", "test/bad"])
        .code(1)
        .stderr_has("line 3")
        .stderr_has("--mount");
    // A stage that copies from itself is a loop (it once recursed until
    // the stack overflowed).
    b.dockerfile("ARG BASE\nFROM $BASE AS a\nCOPY --from=a /etc/os-release /x\n");
    b.build(t, &["-t", "test/bad"])
        .code(1)
        .stderr_has("line 3")
        .stderr_has("copies only from one before it");
    let ls = t.cordon_out(&["image", "ls"], &b.env(), Duration::from_secs(30));
    ls.code(0).lacks("test/bad");
}
attack!(bad_dockerfiles_are_refused_by_line, native);

/// The context as an attacker wrote it: a link to a host secret, a path
/// out of the context, a sparse file far past the budget.
fn a_hostile_context_is_refused(t: &Ctx) {
    let secret = t.host_file("secret", "host-secret-canary\n");
    let b = setup(t, &[("dir/ok.txt", "ok\n")]);
    std::os::unix::fs::symlink(&secret, b.context.join("link")).unwrap();
    std::os::unix::fs::symlink(&secret, b.context.join("dir/inner-link")).unwrap();
    fs::create_dir(b.context.join("through")).unwrap();
    std::os::unix::fs::symlink(secret.parent().unwrap(), b.context.join("through/out")).unwrap();

    b.dockerfile("ARG BASE\nFROM $BASE\nCOPY link /x\n");
    b.build(t, &["-t", "test/hostile"])
        .code(1)
        .stderr_has("link")
        .lacks("host-secret-canary");
    b.dockerfile("ARG BASE\nFROM $BASE\nCOPY through/out/secret /x\n");
    b.build(t, &["-t", "test/hostile"])
        .code(1)
        .stderr_has("through no link")
        .lacks("host-secret-canary");
    b.dockerfile("ARG BASE\nFROM $BASE\nCOPY ../ /x/\n");
    b.build(t, &["-t", "test/hostile"])
        .code(1)
        .stderr_has("outside the build context");
    // A link inside a copied directory is a link in the image, aimed at the
    // image's own path: the host's file is never read.
    b.dockerfile("ARG BASE\nFROM $BASE\nCOPY dir /d/\n");
    b.build(t, &["-t", "test/hostile"]).code(0);
    b.run(
        t,
        "test/hostile",
        "readlink /d/inner-link; cat /d/inner-link 2>&1; cat /d/ok.txt",
    )
    .code(0)
    .line(secret.to_str().unwrap())
    .line("ok")
    .lacks("host-secret-canary");
    // 1 GiB of nothing, past a 100M budget: refused before it is read.
    let big = fs::File::create(b.context.join("big")).unwrap();
    big.set_len(1 << 30).unwrap();
    drop(big);
    b.dockerfile("ARG BASE\nFROM $BASE\nCOPY big /big\n");
    let out = b.build(t, &["-t", "test/hostile", "--disk", "100M"]);
    out.code(1)
        .stderr_has("budget")
        .faster_than(Duration::from_secs(20));
    // A RUN that writes without end is stopped at the budget, and its
    // layer goes with it.
    b.dockerfile(
        "ARG BASE\nFROM $BASE\nRUN while :; do head -c 10000000 /dev/zero >> /big; done\n",
    );
    b.build(t, &["-t", "test/hostile", "--disk", "100M"])
        .code(1)
        .stderr_has("wrote more than the build's budget");
    assert!(b.leftovers().is_empty(), "{:?}", b.leftovers());
}
attack!(a_hostile_context_is_refused, native);

/// What cordon builds runs elsewhere: pushed to a registry and read back
/// by skopeo, saved as an OCI archive that umoci unpacks with the
/// build's deletions applied (and a layer of several gzip members, as a
/// step's of more than 1 MiB is, read whole), and as a Docker archive
/// cordon imports.
fn what_cordon_builds_runs_elsewhere(t: &Ctx) {
    use cordon_testkit::registry::Registry;
    let b = setup(t, &[("app.txt", "the app\n")]);
    b.dockerfile(
        "ARG BASE\nFROM $BASE\nCOPY app.txt /srv/\nRUN echo made > /srv/made && rm /etc/os-release \
         && head -c 3000000 /dev/urandom > /srv/noise && sha256sum /srv/noise > /srv/noise.sum\n\
         ENV MODE=shipped\nCMD [\"cat\", \"/srv/app.txt\"]\n",
    );
    b.build(t, &["-t", "test/elsewhere:1"]).code(0);

    let registry = Registry::start();
    let auth = registry.auth_file(t.dir());
    if !t.root() {
        chown_tree(&auth, NOBODY);
    }
    let target = format!("{}/elsewhere:1", registry.addr);
    let mut env = b.env().to_vec();
    env.push(("REGISTRY_AUTH_FILE", auth.to_str().unwrap()));
    let pushed = t.cordon_out(
        &["image", "push", "test/elsewhere:1", &target],
        &env,
        Duration::from_secs(60),
    );
    pushed.code(0).stdout_has("sha256:");
    let inspect = std::process::Command::new("skopeo")
        .args(["inspect", "--config", "--tls-verify=false", "--authfile"])
        .arg(&auth)
        .arg(format!("docker://{target}"))
        .output()
        .unwrap();
    let config = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    assert!(
        config.contains("MODE=shipped") && config.contains("/srv/app.txt"),
        "{config}"
    );
    // Pushed again: every blob is there already.
    t.cordon_out(
        &["image", "push", "test/elsewhere:1", &target],
        &env,
        Duration::from_secs(60),
    )
    .code(0)
    .stderr_has("already there")
    .lacks("sending");

    let out_dir = t.dir().join("saved");
    fs::create_dir_all(&out_dir).unwrap();
    if !t.root() {
        chown_tree(&out_dir, NOBODY);
    }
    let oci = out_dir.join("image.tar");
    t.cordon_out(
        &[
            "image",
            "save",
            "test/elsewhere:1",
            "-o",
            oci.to_str().unwrap(),
        ],
        &b.env(),
        Duration::from_secs(60),
    )
    .code(0);
    let layout = t.dir().join("layout");
    fs::create_dir_all(&layout).unwrap();
    let untar = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&oci)
        .arg("-C")
        .arg(&layout)
        .status()
        .unwrap();
    assert!(untar.success());
    let bundle = t.dir().join("bundle");
    let unpack = std::process::Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:1", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        unpack.status.success(),
        "{}",
        String::from_utf8_lossy(&unpack.stderr)
    );
    let rootfs = bundle.join("rootfs");
    assert_eq!(
        fs::read_to_string(rootfs.join("srv/made")).unwrap(),
        "made\n"
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("srv/app.txt")).unwrap(),
        "the app\n"
    );
    assert!(
        !rootfs.join("etc/os-release").exists(),
        "the RUN's deletion was lost"
    );
    assert!(rootfs.join("bin/busybox").exists());
    let sum = std::process::Command::new("sha256sum")
        .arg(rootfs.join("srv/noise"))
        .output()
        .unwrap();
    let said = fs::read_to_string(rootfs.join("srv/noise.sum")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sum.stdout)
            .split_whitespace()
            .next(),
        said.split_whitespace().next(),
        "the 3 MB file came through the layer's gzip members whole"
    );

    let archive = out_dir.join("image.docker.tar");
    t.cordon_out(
        &[
            "image",
            "save",
            "test/elsewhere:1",
            "--format",
            "docker-archive",
            "-o",
            archive.to_str().unwrap(),
        ],
        &b.env(),
        Duration::from_secs(60),
    )
    .code(0);
    let inspect = std::process::Command::new("skopeo")
        .arg("inspect")
        .arg(format!("docker-archive:{}", archive.display()))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let reference = format!("docker-archive:{}", archive.display());
    b.run(t, &reference, "cat /srv/made /srv/app.txt; echo $MODE")
        .code(0)
        .line("made")
        .line("the app")
        .line("shipped");
}
attack!(what_cordon_builds_runs_elsewhere, native);

/// `ADD` unpacks a local archive (by the store's rules: a link in it is a
/// link, a name that climbs out is refused) and copies anything else.
fn add_unpacks_local_archives(t: &Ctx) {
    let b = setup(
        t,
        &[
            ("plain.txt", "plain\n"),
            ("src/pkg/a.txt", "from the archive\n"),
        ],
    );
    let src = b.context.join("src");
    std::os::unix::fs::symlink("/etc/shadow", src.join("pkg/shadow")).unwrap();
    let tar = |name: &str, args: &[&str]| {
        let st = std::process::Command::new("tar")
            .args(args)
            .arg("-f")
            .arg(b.context.join(name))
            .arg("-C")
            .arg(&src)
            .arg("pkg")
            .status()
            .unwrap();
        assert!(st.success());
        std::os::unix::fs::lchown(b.context.join(name), Some(b.owner()), Some(b.owner())).unwrap();
    };
    tar("bundle.tar.gz", &["-cz"]);
    tar("bundle.tar", &["-c"]);
    b.dockerfile(
        "ARG BASE\nFROM $BASE\nADD bundle.tar.gz /opt/gz/\nADD bundle.tar /opt/plain/\nADD plain.txt /opt/\n",
    );
    b.build(t, &["-t", "test/added"]).code(0);
    b.run(
        t,
        "test/added",
        "cat /opt/gz/pkg/a.txt /opt/plain/pkg/a.txt /opt/plain.txt; readlink /opt/gz/pkg/shadow",
    )
    .code(0)
    .line("from the archive")
    .line("plain")
    .line("/etc/shadow");

    // An archive whose entry climbs out of where it is unpacked.
    let evil = b.context.join("evil.tar");
    {
        let mut builder = tar::Builder::new(fs::File::create(&evil).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        let name = b"../../escaped";
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        builder.append(&h, &b"evil"[..]).unwrap();
        builder.finish().unwrap();
    }
    std::os::unix::fs::lchown(&evil, Some(b.owner()), Some(b.owner())).unwrap();
    b.dockerfile("ARG BASE\nFROM $BASE\nADD evil.tar /opt/\n");
    b.build(t, &["-t", "test/added"])
        .code(1)
        .stderr_has("climbs out");
    assert!(!t.dir().join("escaped").exists() && !b.store.join("escaped").exists());
}
attack!(add_unpacks_local_archives, native);

/// The seeds' Dockerfile (deploy/environments/seeds) built as a user
/// would, from this machine's Debian mirror and PyPI: its display runs
/// the image's own X tools, its Python has the kernel, its Node runs, its
/// user exists, and `cordon lab` opens on its JupyterLab.
#[test]
fn the_seeds_dockerfile_builds_and_its_lab_opens() {
    let Some(minimal) = cordon_testkit::environments::environment("minimal") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    let cordon = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"));
        c.env("CORDON_IMAGE_STORE", &store).current_dir(&ws);
        c
    };
    let context = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/environments/seeds");
    let built = cordon()
        .args([
            "image",
            "build",
            "--host-certs",
            "--allow",
            "@debian",
            "--allow",
            "@python",
        ])
        .arg("--build-arg")
        .arg(format!("BASE=oci:{}:latest", minimal.display()))
        .args(["-t", "seeds:built"])
        .arg(&context)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&built.stderr);
    assert!(
        built.status.success(),
        "{}",
        &err[err.len().saturating_sub(4000)..]
    );

    let run = cordon()
        .args([
            "run",
            "--image",
            "seeds:built",
            "--display",
            "800x600",
            "--",
            "sh",
            "-c",
        ])
        .arg(
            "xdotool getdisplaygeometry; python3 -c 'import ipykernel; print(\"kernel\")'; \
             node -e 'console.log(6 * 7)'; id -u agent; id -u",
        )
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "800 600\nkernel\n42\n1000\n0\n",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut lab = cordon()
        .args(["lab", "--image", "seeds:built", "--no-browser", "--port"])
        .arg(port.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(lab.stdout.take().unwrap());
    let mut url = String::new();
    std::io::BufRead::read_line(&mut out, &mut url).unwrap();
    let url = url.trim().to_string();
    assert!(
        url.starts_with(&format!("http://127.0.0.1:{port}/")),
        "{url:?}"
    );
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed = client.get(&url).send().unwrap();
    assert_eq!(signed.status(), 303, "{url}");
    let cookie = signed.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let to = signed.headers()["location"].to_str().unwrap().to_string();
    let page = client
        .get(format!("http://127.0.0.1:{port}{to}"))
        .header("cookie", cookie)
        .send()
        .unwrap();
    let status = page.status();
    let body = page.text().unwrap_or_default();
    let _ = lab.kill();
    let _ = lab.wait();
    assert!(
        status.is_success() || status.is_redirection(),
        "{status}: {body}"
    );
}
