//! The two sandbox backends side by side: `native` (namespaces on the
//! host's kernel) and `microvm` (a QEMU microvm guest with its own kernel,
//! under TCG on machines whose /dev/kvm cannot run guests).
//!
//! Measured, alternating between the backends: the time from asking for a
//! sandbox to the first exec's result (`/bin/true`), and the latency of an
//! exec in a warm session (`/bin/true`, and `sh -c true`, which also loads a
//! shell from the shared /usr).

use std::time::{Duration, Instant};

use cordon_sandbox::{BackendKind, ExecRequest, Sandbox, SandboxConfig};

use crate::Args;
use crate::stats::{Json, Summary, ms};

fn config(workspace: &std::path::Path, backend: BackendKind) -> SandboxConfig {
    let mut c = SandboxConfig::new(workspace);
    c.backend = backend;
    c
}

async fn first_exec(workspace: &std::path::Path, backend: BackendKind) -> Result<Duration, String> {
    let start = Instant::now();
    let sb = Sandbox::create(config(workspace, backend))
        .await
        .map_err(|e| format!("{backend}: {e}"))?;
    let out = sb
        .exec(ExecRequest::argv(["/bin/true"]))
        .await
        .map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!("{backend}: /bin/true failed"));
    }
    sb.close().await;
    Ok(took)
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
    let mut cold: [Vec<Duration>; 2] = Default::default();
    // One of each first: page caches, the guest image, the staged binary.
    for b in backends {
        first_exec(workspace, b).await?;
    }
    for _ in 0..cold_rounds {
        for (i, b) in backends.iter().enumerate() {
            cold[i].push(first_exec(workspace, *b).await?);
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
    let s = |v: &[Duration]| Summary::of(v);
    let (cn, cv) = (s(&cold[0]), s(&cold[1]));
    let (tn, tv) = (s(&warm_true[0]), s(&warm_true[1]));
    let (shn, shv) = (s(&warm_sh[0]), s(&warm_sh[1]));
    println!("Sandbox backends: native next to microvm ({limits})");
    println!(
        "  create to first exec's result ({cold_rounds} rounds): native p50 {} ms, microvm p50 {} ms (p90 {}), ratio {:.1}",
        ms(cn.p50),
        ms(cv.p50),
        ms(cv.p90),
        cv.p50 / cn.p50
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
        ("warm_true_native", tn.json()),
        ("warm_true_microvm", tv.json()),
        ("warm_true_ratio_p50", Json::Num(tv.p50 / tn.p50)),
        ("warm_sh_native", shn.json()),
        ("warm_sh_microvm", shv.json()),
        ("warm_sh_ratio_p50", Json::Num(shv.p50 / shn.p50)),
    ]))
}
