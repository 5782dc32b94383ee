//! The two sandbox backends side by side: `native` (namespaces on the
//! host's kernel) and `microvm` (a QEMU microvm guest with its own kernel,
//! under TCG on machines whose /dev/kvm cannot run guests).
//!
//! Measured, alternating between the backends: the time from asking for a
//! sandbox to the first exec's result (`/bin/true`), for a microVM both
//! booted cold and started from its memory snapshot (the default), and the
//! latency of an exec in a warm session (`/bin/true`, and `sh -c true`,
//! which also loads a shell from the shared /usr). Then pause and resume
//! against the memory a process in the sandbox holds, three ways: the
//! freezer cgroup natively and QEMU stopped for a microVM on 9p (memory
//! kept where it is), and a microVM on virtio-fs saved to disk (its QEMU
//! ended while paused, a new one started at the resume).

use std::time::{Duration, Instant};

use cordon_sandbox::{BackendKind, ExecRequest, Sandbox, SandboxConfig, VmShares};

use crate::Args;
use crate::stats::{Json, Summary, ms};

fn config(workspace: &std::path::Path, backend: BackendKind) -> SandboxConfig {
    let mut c = SandboxConfig::new(workspace);
    c.backend = backend;
    c
}

/// The ways of starting that are timed, in the order they alternate.
const STARTS: [(&str, BackendKind, bool); 3] = [
    ("native", BackendKind::Native, false),
    ("microvm booted cold", BackendKind::Microvm, true),
    ("microvm from its snapshot", BackendKind::Microvm, false),
];

/// The time from asking for a sandbox to its first exec's result, and of
/// it the create's; `check` that a microVM started as asked (the
/// warm-up's takes the snapshot).
async fn first_exec(
    workspace: &std::path::Path,
    (name, backend, cold_boot): (&str, BackendKind, bool),
    check: bool,
) -> Result<(Duration, Duration), String> {
    let mut config = config(workspace, backend);
    config.vm.cold_boot = cold_boot;
    let start = Instant::now();
    let sb = Sandbox::create(config)
        .await
        .map_err(|e| format!("{name}: {e}"))?;
    let created = start.elapsed();
    let restored = sb.info().limits.contains("from a snapshot");
    if check && backend == BackendKind::Microvm && restored == cold_boot {
        return Err(format!("{name}: started otherwise ({})", sb.info().limits));
    }
    let out = sb
        .exec(ExecRequest::argv(["/bin/true"]))
        .await
        .map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!("{name}: /bin/true failed"));
    }
    sb.close().await;
    Ok((took, created))
}

async fn warm(sb: &Sandbox, argv: &[&str]) -> Result<Duration, String> {
    let t = Instant::now();
    let out = sb
        .exec(ExecRequest::argv(argv.iter().copied()))
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{argv:?} failed"));
    }
    Ok(t.elapsed())
}

pub async fn run(args: &Args, workspace: &std::path::Path) -> Result<Json, String> {
    let cold_rounds = args.num("cold", 10)?;
    let warm_rounds = args.num("execs", 50)?;
    let backends = [BackendKind::Native, BackendKind::Microvm];
    let mut cold: [Vec<Duration>; 3] = Default::default();
    let mut created: [Vec<Duration>; 3] = Default::default();
    // One of each first: page caches, the guest image, the staged binary,
    // the snapshot.
    for start in STARTS {
        first_exec(workspace, start, false).await?;
    }
    for _ in 0..cold_rounds {
        for (i, start) in STARTS.iter().enumerate() {
            let (took, create) = first_exec(workspace, *start, true).await?;
            cold[i].push(took);
            created[i].push(create);
        }
    }
    let mut warm_true: [Vec<Duration>; 2] = Default::default();
    let mut warm_sh: [Vec<Duration>; 2] = Default::default();
    let sbs = [
        Sandbox::create(config(workspace, backends[0]))
            .await
            .map_err(|e| e.to_string())?,
        Sandbox::create(config(workspace, backends[1]))
            .await
            .map_err(|e| e.to_string())?,
    ];
    for sb in &sbs {
        warm(sb, &["/bin/true"]).await?;
        warm(sb, &["sh", "-c", "true"]).await?;
    }
    for _ in 0..warm_rounds {
        for (i, sb) in sbs.iter().enumerate() {
            warm_true[i].push(warm(sb, &["/bin/true"]).await?);
            warm_sh[i].push(warm(sb, &["sh", "-c", "true"]).await?);
        }
    }
    let limits = sbs[1].info().limits.clone();
    for sb in &sbs {
        sb.close().await;
    }
    let held_sizes: &[u64] = if cold_rounds < 5 {
        &[64]
    } else {
        &[64, 256, 1024]
    };
    let mut pauses = Vec::new();
    println!("Pause and resume against the memory held in the sandbox (p50 of {PAUSES}):");
    for &mib in held_sizes {
        for kind in PAUSE_KINDS {
            let (pause, resume) = pause_resume(workspace, kind, mib).await?;
            let (p, r) = (Summary::of(&pause), Summary::of(&resume));
            println!(
                "  {:18} {mib:5} MiB held: pause p50 {} ms (p90 {}), resume p50 {} ms (p90 {})",
                kind.0,
                ms(p.p50),
                ms(p.p90),
                ms(r.p50),
                ms(r.p90)
            );
            pauses.push(Json::obj([
                ("backend", Json::str(kind.0)),
                ("held_mib", Json::Num(mib as f64)),
                ("pause", p.json()),
                ("resume", r.json()),
            ]));
        }
    }
    let s = |v: &[Duration]| Summary::of(v);
    let (cn, cv, snap) = (s(&cold[0]), s(&cold[1]), s(&cold[2]));
    let snap_create = s(&created[2]);
    let (tn, tv) = (s(&warm_true[0]), s(&warm_true[1]));
    let (shn, shv) = (s(&warm_sh[0]), s(&warm_sh[1]));
    println!("Sandbox backends: native next to microvm ({limits})");
    println!(
        "  create to first exec's result ({cold_rounds} rounds): native p50 {} ms; microvm booted cold p50 {} ms (p90 {}), ratio {:.1}; \
         microvm from its snapshot p50 {} ms (p90 {}), ratio {:.1}, {:.1}x faster than cold",
        ms(cn.p50),
        ms(cv.p50),
        ms(cv.p90),
        cv.p50 / cn.p50,
        ms(snap.p50),
        ms(snap.p90),
        snap.p50 / cn.p50,
        cv.p50 / snap.p50
    );
    println!(
        "  of it, from its snapshot: the create p50 {} ms (p90 {}), the first exec p50 {} ms",
        ms(snap_create.p50),
        ms(snap_create.p90),
        ms(snap.p50 - snap_create.p50),
    );
    println!(
        "  warm exec of /bin/true ({warm_rounds} rounds): native p50 {} ms, microvm p50 {} ms (p90 {}), ratio {:.1}",
        ms(tn.p50),
        ms(tv.p50),
        ms(tv.p90),
        tv.p50 / tn.p50
    );
    println!(
        "  warm exec of sh -c true: native p50 {} ms, microvm p50 {} ms, ratio {:.1}",
        ms(shn.p50),
        ms(shv.p50),
        shv.p50 / shn.p50
    );
    Ok(Json::obj([
        ("microvm", Json::str(limits)),
        ("cold_native", cn.json()),
        ("cold_microvm", cv.json()),
        ("cold_ratio_p50", Json::Num(cv.p50 / cn.p50)),
        ("snapshot_microvm", snap.json()),
        ("snapshot_microvm_create", snap_create.json()),
        ("snapshot_ratio_p50", Json::Num(snap.p50 / cn.p50)),
        ("cold_over_snapshot_p50", Json::Num(cv.p50 / snap.p50)),
        ("warm_true_native", tn.json()),
        ("warm_true_microvm", tv.json()),
        ("warm_true_ratio_p50", Json::Num(tv.p50 / tn.p50)),
        ("warm_sh_native", shn.json()),
        ("warm_sh_microvm", shv.json()),
        ("warm_sh_ratio_p50", Json::Num(shv.p50 / shn.p50)),
        ("pause_resume", Json::Arr(pauses)),
    ]))
}

/// Pauses and resumes timed per sandbox.
const PAUSES: usize = 10;

/// The kinds of pause timed: name, backend, a microVM's shares (which
/// decide whether it is saved to disk), and whether it is taken up by a
/// new session between the pause and the resume (as a server restarted
/// does: the pause includes `keep`, the resume `reattach`).
const PAUSE_KINDS: [(&str, BackendKind, VmShares, bool); 4] = [
    ("native", BackendKind::Native, VmShares::Auto, false),
    (
        "microvm in memory",
        BackendKind::Microvm,
        VmShares::NineP,
        false,
    ),
    (
        "microvm to disk",
        BackendKind::Microvm,
        VmShares::VirtioFs,
        false,
    ),
    (
        "microvm taken up",
        BackendKind::Microvm,
        VmShares::VirtioFs,
        true,
    ),
];

/// A sandbox whose process holds `mib` MiB (written, so resident), paused
/// and resumed [`PAUSES`] times; the process is checked to be alive after.
async fn pause_resume(
    workspace: &std::path::Path,
    (name, backend, shares, taken_up): (&str, BackendKind, VmShares, bool),
    mib: u64,
) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let mut c = config(workspace, backend);
    c.vm.shares = shares;
    let state = tempfile::tempdir().map_err(|e| e.to_string())?;
    if taken_up {
        c.vm.state_dir = Some(state.path().join("vm"));
    }
    // Room for the kernel (a microVM's) and the holder beside it.
    c.memory = Some((mib + 384) << 20);
    let mut sb = Sandbox::create(c.clone())
        .await
        .map_err(|e| e.to_string())?;
    let limits = &sb.info().limits;
    if backend == BackendKind::Microvm
        && limits.contains("virtio-fs") != (shares == VmShares::VirtioFs)
    {
        return Err(format!("{name}: started otherwise ({limits})"));
    }
    let hold = format!(
        "rm -f /tmp/held; nohup python3 -c \"import time; b = b'x' * ({mib} << 20); \
         open('/tmp/held', 'w').close(); time.sleep(1e6)\" >/dev/null 2>&1 & \
         while ! test -e /tmp/held; do sleep 0.05; done"
    );
    let out = sb
        .exec(ExecRequest::shell(&hold))
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{name}: holding {mib} MiB failed: {}",
            out.stderr_str()
        ));
    }
    let (mut pause, mut resume) = (Vec::new(), Vec::new());
    for _ in 0..PAUSES {
        let t = Instant::now();
        sb.pause().await.map_err(|e| e.to_string())?;
        if taken_up {
            sb.keep().await.map_err(|e| e.to_string())?;
        }
        pause.push(t.elapsed());
        let t = Instant::now();
        if taken_up {
            sb = cordon_sandbox::MicrovmBackend
                .reattach(&c)
                .await
                .map_err(|e| e.to_string())?;
        }
        sb.resume().await.map_err(|e| e.to_string())?;
        resume.push(t.elapsed());
    }
    let out = sb
        .exec(ExecRequest::shell("pgrep -f 'time.sleep' >/dev/null"))
        .await
        .map_err(|e| e.to_string())?;
    sb.close().await;
    if !out.status.success() {
        return Err(format!("{name}: the holder did not survive its pauses"));
    }
    Ok((pause, resume))
}
