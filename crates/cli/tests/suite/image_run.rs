//! `cordon run --image` as a user types it, as root and as an unprivileged
//! caller, and in a microVM: the image's files are the root, root inside owns them and can
//! change them (the writable layer), several users exist inside, the
//! image's config applies, and nothing of the run is left on the host.
//! And the image as an attacker wrote it: links where cordon mounts or
//! writes, aimed at the host's files.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use cordon_testkit::oci::{Entry, Layer, busybox_layer, layer_of, write_image};
use serde_json::json;

/// A busybox image at `oci:DIR:v1` with `extra` layers on top, and a store
/// of its own that the run's user owns.
struct Image {
    reference: String,
    store: PathBuf,
}

fn image(t: &Ctx, extra: &[Layer], config: serde_json::Value) -> Image {
    let layout = t.dir().join("layout");
    let mut layers = vec![busybox_layer()];
    layers.extend(extra.iter().cloned());
    write_image(&layout, "v1", &layers, config);
    let store = t.dir().join("store");
    fs::create_dir_all(&store).unwrap();
    if !t.root() && !t.vm() {
        // The unprivileged variant runs as nobody; its store is its own.
        for p in [&layout, &store] {
            chown_tree(p, NOBODY);
        }
    }
    Image {
        reference: format!("oci:{}:v1", layout.display()),
        store,
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

impl Image {
    fn run(&self, t: &Ctx, opts: &[&str], argv: &[&str]) -> Out {
        self.run_within(t, opts, argv, t.within(Duration::from_secs(60)))
    }

    fn run_within(&self, t: &Ctx, opts: &[&str], argv: &[&str], deadline: Duration) -> Out {
        let mut all = vec!["--image", &self.reference];
        all.extend_from_slice(opts);
        let store = self.store.to_str().unwrap();
        t.run_env(&[("CORDON_IMAGE_STORE", store)], &all, argv, deadline)
    }

    fn sh(&self, t: &Ctx, script: &str) -> Out {
        self.run(t, &[], &["sh", "-c", script])
    }

    /// What is left in the store's directory of writable layers.
    fn leftovers(&self) -> Vec<String> {
        fs::read_dir(self.store.join("run"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The image's files are the root; root inside owns them, changes them,
/// and makes files as other users; none of it outlives the run.
fn root_inside_changes_its_image(t: &Ctx) {
    let img = image(
        t,
        &[],
        json!({"Env": ["PATH=/bin", "GREETING=from-the-image"]}),
    );
    let out = img.sh(
        t,
        "id -u; id -g; cat /etc/os-release; echo $GREETING; echo $HOME; pwd; \
         echo changed > /etc/os-release && cat /etc/os-release; \
         mkdir -p /srv/data && chown 1000:1000 /srv/data && stat -c %u:%g /srv/data; \
         echo 'builder:x:1234:1234::/tmp:/bin/sh' >> /etc/passwd && \
         su -s /bin/sh builder -c 'id -u; touch /tmp/by-builder' && \
         stat -c %u /tmp/by-builder; \
         ls /usr 2>&1 | head -1",
    );
    out.code(0)
        .line("0")
        .line("ID=cordon-busybox")
        .line("from-the-image")
        .line("/root")
        .line("/workspace")
        .line("changed")
        .line("1000:1000")
        .line("1234")
        .lacks("python");
    // The host's /usr is not there: the image has none.
    assert!(out.stdout.contains("No such file"), "{}", out.stdout);
    // A second run starts from the image again.
    img.sh(t, "cat /etc/os-release; id -un builder 2>&1")
        .code(1)
        .line("ID=cordon-busybox");
    assert!(
        img.leftovers().is_empty(),
        "{:?}\n{}",
        img.leftovers(),
        String::from_utf8_lossy(
            &std::process::Command::new("find")
                .arg(img.store.join("run"))
                .args(["-printf", "%u:%g %m %p\n"])
                .output()
                .unwrap()
                .stdout
        )
    );
}
attack!(root_inside_changes_its_image);

/// The workspace is the workspace, as root inside; what root makes there
/// belongs to the caller on the host, and what it gives another user
/// belongs to no one on the host.
fn the_workspace_is_the_callers(t: &Ctx) {
    let img = image(t, &[], json!({}));
    img.sh(
        t,
        "echo hi > /workspace/made && touch /workspace/given && chown 1000:1000 /workspace/given \
         && stat -c %u:%g /workspace/given",
    )
    .code(0)
    .line("1000:1000");
    use std::os::unix::fs::MetadataExt;
    let made = t.workspace.join("made");
    let owner = if t.root() { 0 } else { NOBODY };
    assert_eq!(fs::metadata(&made).unwrap().uid(), owner);
    assert_eq!(fs::read_to_string(made).unwrap(), "hi\n");
    // What the sandbox gives its user 1000 is not the host's user 1000's:
    // a host id of the sandbox's own (root's range, or the caller's
    // subordinate ids).
    let given = fs::metadata(t.workspace.join("given")).unwrap();
    assert!(
        given.uid() >= 1 << 31 && given.gid() >= 1 << 31,
        "{}:{}",
        given.uid(),
        given.gid()
    );
}
attack!(the_workspace_is_the_callers, native);

/// The writable layer is scratch, so overlay skips its syncs (dpkg syncs
/// every file it unpacks); the workspace is a bind of the host's
/// directory, and its syncs are real.
fn only_the_root_s_syncs_are_skipped(t: &Ctx) {
    let img = image(t, &[], json!({}));
    img.sh(
        t,
        "echo root=$(grep ' / / ' /proc/self/mountinfo | grep -c 'overlay.*volatile'); \
         echo workspace=$(grep ' /workspace ' /proc/self/mountinfo | grep -vc volatile)",
    )
    .code(0)
    .line("root=1")
    .line("workspace=1");
}
attack!(only_the_root_s_syncs_are_skipped, native);

/// The image's `User` and `WorkingDir`, and `--user` over them.
fn the_images_user_and_directory_apply(t: &Ctx) {
    let img = image(
        t,
        &[layer_of(&[
            Entry::Dir {
                path: "home",
                mode: 0o755,
            },
            Entry::Dir {
                path: "home/app",
                mode: 0o755,
            },
        ])],
        json!({"User": "app", "WorkingDir": "/home/app"}),
    );
    img.sh(t, "id -u; id -g; pwd")
        .code(0)
        .line("1000")
        .line("1000")
        .line("/home/app");
    img.run(
        t,
        &["--user", "root", "--workdir", "/workspace"],
        &["sh", "-c", "id -u; pwd"],
    )
    .code(0)
    .line("0")
    .line("/workspace");
    // A user the image does not have is refused before anything runs.
    img.run(t, &["--user", "nosuch"], &["true"])
        .code(78)
        .stderr_has("no user \"nosuch\"");
}
attack!(the_images_user_and_directory_apply);

/// An image whose `User` is not root writes its workspace, and what it
/// writes there is the caller's on the host (root's sandboxes map the
/// workspace's owner to that user). An unprivileged caller and a microVM
/// cannot make that mapping, and the user is told so before it runs.
fn the_images_user_writes_the_workspace(t: &Ctx) {
    let img = image(t, &[], json!({"User": "app"}));
    let out = img.sh(
        t,
        "id -u; stat -c %u /workspace; echo hi > /workspace/by-app && stat -c %u /workspace/by-app",
    );
    if !t.root() || t.vm() {
        // Neither can map ids for the workspace (no idmapped mount
        // unprivileged; 9p in a microVM): the user is told, at once.
        out.stderr_has("which cannot write /workspace");
        return;
    }
    out.code(0).line("1000").line("1000").line("1000");
    use std::os::unix::fs::MetadataExt;
    let made = fs::metadata(t.workspace.join("by-app")).unwrap();
    assert_eq!(made.uid(), 0, "the caller's on the host");
    // As root (`--user`) the workspace is root's again, as without a User.
    img.run(
        t,
        &["--user", "root"],
        &[
            "sh",
            "-c",
            "stat -c %u /workspace; echo hi > /workspace/by-root",
        ],
    )
    .code(0)
    .line("0");
    assert_eq!(fs::metadata(t.workspace.join("by-root")).unwrap().uid(), 0);
}
attack!(the_images_user_writes_the_workspace);

/// An image whose `/workspace`, `/tmp`, `/proc` and `/etc/hosts` are links
/// to the host's files, and whose `/etc` has a link to the host's shadow:
/// cordon replaces what stands where it mounts and writes, follows none of
/// it, and the host's files are untouched.
fn links_in_the_image_lead_nowhere(t: &Ctx) {
    let canary = t.host_file("canary", "host secret\n");
    let canary_s = canary.to_str().unwrap();
    let img = image(
        t,
        &[layer_of(&[
            Entry::Link {
                path: "workspace",
                target: "/etc",
            },
            Entry::Link {
                path: "tmp",
                target: canary_s,
            },
            Entry::Link {
                path: "proc",
                target: "/",
            },
            Entry::Link {
                path: "dev",
                target: "/dev",
            },
            Entry::Link {
                path: "etc/hosts",
                target: canary_s,
            },
            Entry::Link {
                path: "etc/resolv.conf",
                target: "/etc/passwd",
            },
            Entry::Link {
                path: "etc/hostname",
                target: "../../../../../../../etc/hostname",
            },
        ])],
        json!({}),
    );
    let host_passwd = fs::read_to_string("/etc/passwd").unwrap();
    let out = img.sh(
        t,
        "ls -d /workspace /tmp /proc /dev; test -L /workspace || echo ws-real; \
         test -L /etc/hosts || echo hosts-real; grep -c localhost /etc/hosts; cat /workspace/.probe",
    );
    out.code(0).line("ws-real").line("hosts-real").line("probe");
    assert_eq!(fs::read_to_string(&canary).unwrap(), "host secret\n");
    assert_eq!(fs::read_to_string("/etc/passwd").unwrap(), host_passwd);
}

fn setup_probe(t: &Ctx) {
    fs::write(t.workspace.join(".probe"), "probe\n").unwrap();
    fs::set_permissions(
        t.workspace.join(".probe"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
}

fn links_in_the_image(t: &Ctx) {
    setup_probe(t);
    links_in_the_image_lead_nowhere(t);
}
attack!(links_in_the_image);

/// An image of deploy/environments/ with a store of the run's user.
fn environment_image(t: &Ctx, name: &'static str) -> Option<Image> {
    let layout = cordon_testkit::environments::environment(name)?;
    let store = t.dir().join("store");
    fs::create_dir_all(&store).unwrap();
    if !t.root() && !t.vm() {
        chown_tree(&store, NOBODY);
    }
    Some(Image {
        reference: format!("oci:{}:latest", layout.display()),
        store,
    })
}

/// apt-get in Debian's minimal environment, with @debian's mirror allowed:
/// a package that adds a system user and hands it a set-gid directory, one
/// with a set-uid binary, as root inside. The host's packages and dpkg
/// database are untouched, the image's Python is not the host's (it has
/// none), and set-id bits stay refused in the workspace.
fn apt_installs_packages(t: &Ctx) {
    let Some(img) = environment_image(t, "minimal") else {
        return;
    };
    let dpkg_before = fs::read("/var/lib/dpkg/status").unwrap();
    // A guest under TCG unpacks packages several times slower.
    let deadline = if t.vm() { 300 } else { 60 };
    let out = img.run_within(
        t,
        &["--allow", "@debian", "--memory", "1G"],
        &[
            "bash",
            "-c",
            "set -e; apt-get update -q >/dev/null; \
             apt-get install -y -q --no-install-recommends hello uuid-runtime sudo >/tmp/apt.log 2>&1 \
               || { tail -20 /tmp/apt.log; exit 1; }; \
             hello; id -un uuidd; stat -c '%a %U:%G' /var/lib/libuuid /usr/bin/sudo; \
             command -v python3 || echo no-python; \
             touch /workspace/tool; chmod u+s /workspace/tool 2>&1 || true; \
             stat -c %a /workspace/tool",
        ],
        Duration::from_secs(deadline),
    );
    out.code(0)
        .line("Hello, world!")
        .line("uuidd")
        .line("2775 uuidd:uuidd")
        .line("4755 root:root")
        .line("no-python")
        .line("644");
    assert_eq!(fs::read("/var/lib/dpkg/status").unwrap(), dpkg_before);
    assert!(
        !Path::new("/usr/bin/hello").exists(),
        "hello reached the host"
    );
    assert!(img.leftovers().is_empty(), "{:?}", img.leftovers());
}
attack!(apt_installs_packages);

/// A C program racing and guessing at the set-id gate, built static on
/// the host so that it runs in any image.
const GATE_ATTACK: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile int stop;
static int ws, ov;

static void *swap_fds(void *_) {
    while (!stop) { dup2(ws, 100); dup2(ov, 100); }
    return 0;
}

static void *flip_link(void *_) {
    while (!stop) {
        unlink("/flip"); symlink("/workspace/victim", "/flip");
        unlink("/flip"); symlink("/etc/cordon-target", "/flip");
    }
    return 0;
}

int main(int argc, char **argv) {
    ws = open("/workspace/victim", O_RDWR | O_CREAT, 0755);
    ov = open("/etc/cordon-target", O_RDWR | O_CREAT, 0755);
    if (ws < 0 || ov < 0) { perror("open"); return 2; }
    int direct = fchmod(ws, 04755);
    printf("direct %d\n", direct);
    printf("overlay %d\n", fchmod(ov, 04755));
    pthread_t t;
    if (!strcmp(argv[1], "fd")) {
        pthread_create(&t, 0, swap_fds, 0);
        for (int i = 0; i < 20000; i++) fchmod(100, 04755);
    } else if (!strcmp(argv[1], "path")) {
        pthread_create(&t, 0, flip_link, 0);
        for (int i = 0; i < 20000; i++) chmod("/flip", 04755);
    } else {
        for (int i = 0; i < 20000; i++) {
            uint64_t k[2];
            getrandom(k, sizeof k, 0);
            uint64_t dfd = (k[0] << 32) | (uint32_t)AT_FDCWD;
            uint64_t mode = (k[1] << 16) | 04755;
            syscall(452, dfd, "/workspace/victim", mode, 0);
        }
        return 0;
    }
    stop = 1;
    pthread_join(t, 0);
    return 0;
}
"#;

/// The gate built once per test process, in the test's directory tree.
fn gate_attack(t: &Ctx) -> PathBuf {
    let src = t.dir().join("gate.c");
    fs::write(&src, GATE_ATTACK).unwrap();
    let bin = t.workspace.join("gate");
    let out = std::process::Command::new("gcc")
        .args(["-static", "-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc (scripts/packages.txt)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// The set-id gate under attack: a descriptor swapped under a waiting
/// `fchmod`, a link flipped under a waiting `chmod`, and 20,000 guesses at
/// the supervisor's key. The workspace file never gets a set-id bit; an
/// image file does, directly.
fn the_setid_gate_holds(t: &Ctx) {
    gate_attack(t);
    let img = image(t, &[], json!({}));
    for how in ["fd", "path", "keys"] {
        let out = img.run(t, &[], &["/workspace/gate", how]);
        out.code(0).line("direct -1").line("overlay 0");
        let mode = fs::metadata(t.workspace.join("victim"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o6000, 0, "{how}: the workspace file got {mode:o}");
    }
}
attack!(the_setid_gate_holds, native);

/// What root inside has and has not: the image's capabilities and no
/// more; no namespace, mount, chroot or device node; nothing of the
/// host's files.
fn root_inside_stays_inside(t: &Ctx) {
    let canary = t.host_file("canary", "host secret\n");
    let img = image(t, &[], json!({}));
    let script = format!(
        "grep -E '^Cap(Eff|Bnd)' /proc/self/status; \
         unshare -U true 2>/dev/null && echo USERNS; \
         unshare -m true 2>/dev/null && echo MOUNTNS; \
         mount -t tmpfs t /tmp 2>/dev/null && echo MOUNTED; \
         chroot / true 2>/dev/null && echo CHROOT; \
         mknod /tmp/mem c 1 1 2>/dev/null && echo MKNOD; \
         mknod /mem c 1 1 2>/dev/null && echo MKNOD-ROOT; \
         echo x > /proc/sys/kernel/hostname 2>/dev/null && echo PROCSYS; \
         cat {} 2>/dev/null && echo HOSTFILE; \
         ls /proc/1/root/workspace >/dev/null && echo own-root; \
         echo done",
        canary.display()
    );
    img.sh(t, &script)
        .code(0)
        .line("CapEff:\t00000000800004fb")
        .line("CapBnd:\t00000000800004fb")
        .only_lines(&[
            "CapEff:\t00000000800004fb",
            "CapBnd:\t00000000800004fb",
            "own-root",
            "done",
        ]);
}
attack!(root_inside_stays_inside, native);

/// A microVM's flat root is shared by every guest that runs the image:
/// its root writing the disk, or mounting it read-write, changes nothing
/// of it on the host (QEMU opens it read-only), and the next guest finds
/// the image as it was.
fn the_flat_root_is_read_only_to_every_guest(t: &Ctx) {
    let img = image(t, &[], json!({}));
    img.sh(t, "true").code(0);
    let flat = fs::read_dir(img.store.join("flat"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "ext4"))
        .expect("the first run made the flat root");
    let before = fs::read(&flat).unwrap();
    let out = img.sh(
        t,
        "for d in /sys/block/vd*; do echo \"${d##*/} $(cat $d/serial) ro=$(cat $d/ro)\"; done; \
         disk=$(for d in /sys/block/vd*; do [ \"$(cat $d/serial)\" = cordon-image ] && echo ${d##*/}; done); \
         dd if=/dev/zero of=/dev/$disk bs=4096 count=16 conv=notrunc 2>&1 || echo dd-refused; \
         mkdir /m; mount -t ext4 -o rw /dev/$disk /m 2>&1; \
         touch /m/image/planted 2>&1 || echo write-refused; \
         echo done",
    );
    out.code(0)
        .line("done")
        .line("dd-refused")
        .line("write-refused");
    assert!(out.stdout.contains("cordon-image ro=1"), "{}", out.stdout);
    assert!(
        fs::read(&flat).unwrap() == before,
        "HOST CHANGED: a guest changed the shared flat root"
    );
    img.sh(t, "cat /etc/os-release")
        .code(0)
        .line("ID=cordon-busybox");
}

#[test]
fn the_flat_root_is_read_only_to_every_guest_microvm() {
    if let Some(t) = Ctx::new(Mode::Microvm) {
        the_flat_root_is_read_only_to_every_guest(&t);
    }
}

/// The writable layer counts against `--disk`: filling the image's own
/// root stops the sandbox as filling the workspace does. Where cordon can
/// make the layer a disk as big as the budget (a microVM's, and root's
/// natively, mounted in the sandbox's own namespace), writes past it fail
/// and the sandbox goes on; the host sees no mount of it.
fn the_writable_layer_counts_against_the_disk_budget(t: &Ctx) {
    let img = image(t, &[], json!({}));
    if t.vm() || t.root() {
        let out = img.run(
            t,
            &["--disk", "16M"],
            &["sh", "-c", "dd if=/dev/zero of=/big bs=1M count=32 2>&1; sync; echo survived; df -k / | tail -1"],
        );
        out.code(0)
            .stdout_has("No space left on device")
            .line("survived");
        assert!(img.leftovers().is_empty(), "{:?}", img.leftovers());
        let store = img.store.to_str().unwrap();
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(store),
            "the layer's disk is mounted on the host:\n{mounts}"
        );
        // Its loop device goes with the sandbox's namespace.
        let attached = || {
            fs::read_dir("/sys/block").unwrap().flatten().any(|dev| {
                fs::read_to_string(dev.path().join("loop/backing_file"))
                    .is_ok_and(|b| b.contains(store))
            })
        };
        assert!(
            eventually(Duration::from_secs(5), || !attached()),
            "a loop device is still attached to the layer's disk"
        );
        return;
    }
    let out = img.run(
        t,
        &["--disk", "16M"],
        &["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do dd if=/dev/zero of=/big$i bs=1M count=4 2>/dev/null; sleep 0.1; done; echo survived"],
    );
    out.code(123)
        .stderr_has("disk budget exceeded")
        .lacks("survived");
    assert!(img.leftovers().is_empty(), "{:?}", img.leftovers());
}
attack!(the_writable_layer_counts_against_the_disk_budget);

/// The seeds' environment (deploy/environments/build seeds): Python with
/// its Jupyter kernel, Node.js, git, and a display the computer tool can
/// drive, all the image's own. As root only: the unprivileged variant of
/// the same machinery is the apt test's, and this image is large.
#[test]
fn the_seeds_environment_has_the_seeds_tools() {
    let Some(t) = Ctx::new(Mode::Root) else {
        return;
    };
    let Some(img) = environment_image(&t, "seeds") else {
        return;
    };
    // The first pull unpacks some 750 MB: a step of its own, with time.
    let pull = std::process::Command::new(t.cordon_path())
        .args(["image", "pull", &img.reference])
        .env("CORDON_IMAGE_STORE", &img.store)
        .output()
        .unwrap();
    assert!(
        pull.status.success(),
        "{}",
        String::from_utf8_lossy(&pull.stderr)
    );
    img.run(
        &t,
        &["--display", "800x600", "--memory", "1G"],
        &[
            "bash",
            "-c",
            "python3 -c 'import ipykernel, sys; print(\"python\", sys.version_info[0])'; \
             node -e 'console.log(\"node\", 40 + 2)'; xdotool getdisplaygeometry; \
             git --version | cut -d' ' -f1",
        ],
    )
    .code(0)
    .line("python 3")
    .line("node 42")
    .line("800 600")
    .line("git");
}

/// A user without subordinate ids is told what to add, and nothing runs.
#[test]
fn a_user_without_subordinate_ids_is_told_what_to_add() {
    if euid() != 0 {
        // As that user already: the message is what the test looks for
        // only where no range is configured, which root can arrange.
        return;
    }
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let layout = dir.path().join("layout");
    write_image(&layout, "v1", &[busybox_layer()], json!({}));
    let ws = dir.path().join("ws");
    fs::create_dir(&ws).unwrap();
    chown_tree(dir.path(), 65533);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--image"])
        .arg(format!("oci:{}:v1", layout.display()))
        .args(["--", "sh", "-c", "echo ran"])
        .current_dir(&ws)
        .env("CORDON_IMAGE_STORE", dir.path().join("store"))
        .env("HOME", dir.path().join("home"))
        .uid(65533)
        .gid(65533)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    assert!(
        stderr.contains("/etc/subuid") && stderr.contains("usermod --add-subuids"),
        "{stderr}"
    );
}
