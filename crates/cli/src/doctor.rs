//! `cordon doctor`: what this host offers, and what a sandbox really gets,
//! checked from inside one rather than inferred.

use std::collections::HashMap;

use clap::Args;
use cordon_sandbox::{ExecRequest, Sandbox, SandboxConfig};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Also require the microvm backend to work (its checks then count as
    /// failures rather than notes)
    #[arg(long, value_name = "NAME")]
    backend: Option<cordon_sandbox::BackendKind>,
}

const NAMESPACES: &[&str] = &["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"];

/// Collects facts inside the sandbox as `key=value` lines.
const PROBE: &str = r#"
for ns in user mnt pid net ipc uts cgroup; do echo "ns_$ns=$(readlink /proc/self/ns/$ns)"; done
n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo "procs=$n"
grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status | tr -d ' \t' | sed 's/:/=/'
echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ',')"
echo "env=$(env | cut -d= -f1 | sort | tr '\n' ',')"
if touch /usr/.cordon-probe 2>/dev/null; then echo usr_writable=yes; rm -f /usr/.cordon-probe; else echo usr_writable=no; fi
if touch /workspace/.cordon-probe 2>/dev/null; then echo ws_writable=yes; rm -f /workspace/.cordon-probe; else echo ws_writable=no; fi
echo "home_visible=$(ls /root /home/* 2>/dev/null | wc -l)"
echo "uid=$(id -u)"
"#;

struct Report {
    failures: usize,
}

impl Report {
    fn line(&mut self, ok: bool, what: &str, detail: impl std::fmt::Display) {
        if !ok {
            self.failures += 1;
        }
        println!("  {} {what:<26} {detail}", if ok { "ok  " } else { "FAIL" });
    }
}

pub async fn doctor(args: DoctorArgs) -> i32 {
    println!("host");
    for (k, v) in cordon_sandbox::host_report() {
        println!("       {k:<44} {v}");
    }
    let mut r = Report { failures: 0 };
    println!("sandbox (native backend)");
    let dir = match tempdir() {
        Ok(d) => d,
        Err(e) => {
            r.line(
                false,
                "workspace",
                format!("cannot create a scratch directory: {e}"),
            );
            return 1;
        }
    };
    let sandbox = match Sandbox::create(SandboxConfig::new(&dir)).await {
        Ok(s) => s,
        Err(e) => {
            r.line(false, "create", e);
            let _ = std::fs::remove_dir_all(&dir);
            return 1;
        }
    };
    r.line(true, "create", "a sandbox starts");
    let probe = sandbox.exec(ExecRequest::shell(PROBE)).await;
    sandbox.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    let out = match probe {
        Ok(o) => o,
        Err(e) => {
            r.line(false, "probe", e);
            return 1;
        }
    };
    let facts: HashMap<String, String> = out
        .stdout_str()
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let get = |k: &str| facts.get(k).map(String::as_str).unwrap_or("?");

    let mut separate = Vec::new();
    let mut shared = Vec::new();
    for ns in NAMESPACES {
        let host = std::fs::read_link(format!("/proc/self/ns/{ns}"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !host.is_empty() && get(&format!("ns_{ns}")) != host && get(&format!("ns_{ns}")) != "?" {
            separate.push(*ns);
        } else {
            shared.push(*ns);
        }
    }
    r.line(
        shared.is_empty(),
        "namespaces",
        if shared.is_empty() {
            format!("own {}", separate.join(", "))
        } else {
            format!("shared with the host: {}", shared.join(", "))
        },
    );
    // Counted by the shell itself: the sandbox's init and the probe.
    r.line(
        get("procs") == "2",
        "processes visible",
        format!(
            "{} (the sandbox's init and the probe; none of the host's)",
            get("procs")
        ),
    );
    let caps_zero = ["CapEff", "CapPrm", "CapBnd"]
        .iter()
        .all(|k| get(k).trim_start_matches('0').is_empty());
    r.line(
        caps_zero,
        "capabilities",
        format!("effective {} bounding {}", get("CapEff"), get("CapBnd")),
    );
    r.line(get("NoNewPrivs") == "1", "no_new_privs", get("NoNewPrivs"));
    r.line(
        get("Seccomp") == "2",
        "seccomp",
        format!(
            "mode {} with {} filters",
            get("Seccomp"),
            get("Seccomp_filters")
        ),
    );
    let landlock = &sandbox.info().landlock;
    r.line(landlock.starts_with("fully"), "landlock", landlock);
    r.line(
        get("ifaces") == "lo,",
        "network",
        format!("interfaces: {}", get("ifaces").trim_end_matches(',')),
    );
    let env = get("env").trim_end_matches(',').to_string();
    let allowed = [
        "HOME", "LANG", "PATH", "PWD", "SHLVL", "TERM", "_", "OLDPWD",
    ];
    r.line(
        env.split(',').all(|k| allowed.contains(&k)),
        "environment",
        format!("built from nothing: {env}"),
    );
    r.line(
        get("usr_writable") == "no",
        "system directories",
        "read-only",
    );
    r.line(
        get("ws_writable") == "yes",
        "workspace",
        "read-write at /workspace",
    );
    r.line(get("home_visible") == "0", "host homes", "not mounted");
    let limits = &sandbox.info().limits;
    r.line(true, "memory and pids limits", limits);
    microvm(
        &mut r,
        args.backend == Some(cordon_sandbox::BackendKind::Microvm),
    )
    .await;
    lab();
    if r.failures == 0 {
        println!("all isolation features are in force");
        0
    } else {
        println!("{} check(s) failed", r.failures);
        1
    }
}

/// JupyterLab and the kernel behind `run_code`: optional, so a note.
fn lab() {
    println!("jupyter (notes: optional)");
    let cache = cordon_lab::cache_dir();
    match cordon_lab::installed(&cache) {
        Some(lab) => println!(
            "  ok   {:<26} JupyterLab {}, ipykernel {}, Python {} in {}",
            "lab environment",
            lab.versions.jupyterlab,
            lab.versions.ipykernel,
            lab.versions.python,
            lab.dir.display()
        ),
        None => println!(
            "  note {:<26} not installed in {}: run `cordon lab setup`",
            "lab environment",
            cache.display()
        ),
    }
}

/// The microvm backend: QEMU, the guest kernel, and which accelerator
/// really runs a guest, found by booting one each way.
async fn microvm(r: &mut Report, required: bool) {
    use cordon_sandbox::microvm::{image, probe_kvm};
    println!(
        "microvm backend{}",
        if required {
            ""
        } else {
            " (notes: not the default backend)"
        }
    );
    let mut line = |ok: bool, what: &str, detail: String| {
        if required || ok {
            r.line(ok, what, detail);
        } else {
            println!("  note {what:<26} {detail}");
        }
    };
    let kernel = image::find_kernel(&image::cache_dir(), None, None);
    match &kernel {
        Ok(k) => line(
            true,
            "guest kernel",
            format!("{} ({})", k.version, k.vmlinux.display()),
        ),
        Err(e) => line(false, "guest kernel", e.to_string()),
    }
    let Ok(dir) = tempdir() else { return };
    let mut config = SandboxConfig::new(&dir);
    config.backend = cordon_sandbox::BackendKind::Microvm;
    let qemu = cordon_sandbox::microvm::qemu_path(&config);
    match &qemu {
        Ok(q) => line(true, "qemu", q.display().to_string()),
        Err(e) => line(false, "qemu", e.to_string()),
    }
    if kernel.is_err() || qemu.is_err() {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    match probe_kvm(&config).await {
        Ok(t) => line(
            true,
            "kvm",
            format!("a KVM guest ran /bin/true {} ms after start", t.as_millis()),
        ),
        // Not a failure: TCG still works, only slower.
        Err(why) => println!("  note {:<26} {why}: TCG is used", "kvm"),
    }
    config.vm.accel = Some(cordon_sandbox::Accel::Tcg);
    let start = std::time::Instant::now();
    let booted = async {
        let sb = Sandbox::create(config).await.map_err(|e| e.to_string())?;
        let out = sb
            .exec(ExecRequest::shell("uname -r"))
            .await
            .map_err(|e| e.to_string());
        let how = if sb.info().limits.contains("from a snapshot") {
            "started from a snapshot"
        } else {
            "booted cold"
        };
        sb.close().await;
        out.map(|o| (o, how))
    }
    .await;
    match booted {
        Ok((out, how)) if out.status.success() => line(
            true,
            "tcg",
            format!(
                "a guest (kernel {}, {how}) ran its first command {} ms after start",
                out.stdout_str().trim(),
                start.elapsed().as_millis()
            ),
        ),
        Ok((out, _)) => line(
            false,
            "tcg",
            format!("the guest's command failed: {}", out.stderr_str()),
        ),
        Err(e) => line(false, "tcg", e),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let p = base.join(format!("cordon-doctor-{}-{i}", std::process::id()));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free scratch directory name"))
}
