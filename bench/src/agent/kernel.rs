//! Python through the Jupyter kernel behind `run_code`, next to a fresh
//! interpreter per call, in one sandbox with the lab environment bound the
//! way the agent and the server bind it (`cordon_lab::offer`).
//!
//! Measured, the ways alternating call by call so that a noisy host
//! disturbs each alike:
//!
//! - a trivial call (`x = 1 + 1; print(x)`) on a warm kernel, next to
//!   `python3 -c 'print(1 + 1)'` as one exec, and next to the way
//!   `run_code` ran Python without a kernel (and still does without the lab
//!   environment): `sh` writes the code to a file in /tmp, `python3` runs
//!   it, the file is removed ([`cordon_tools::run_code::program_request`]);
//! - a call that needs numpy and matplotlib's pyplot: on the kernel they
//!   were imported by an earlier call and the import is a lookup, while a
//!   fresh interpreter (the environment's, which has them) imports them
//!   every time;
//! - the kernel's first call: starting it (the bridge, then ipykernel),
//!   its first trivial call, then its first import of the heavy modules.
//!
//! Every call's output is checked, so a broken way cannot look fast.

use std::time::{Duration, Instant};

use cordon_sandbox::{ExecRequest, Network, Sandbox, SandboxConfig};
use cordon_tools::kernel::Kernel;
use cordon_tools::run_code::{Language, program_request};

use crate::Args;
use crate::stats::{Json, Summary, ms};

const TRIVIAL_KERNEL: &str = "x = 1 + 1; print(x)";
const TRIVIAL_PYTHON: &str = "print(1 + 1)";
/// Realistic for an agent's analysis: numbers and a plot.
const HEAVY: &str =
    "import numpy as np\nimport matplotlib.pyplot as plt\nprint(int(np.arange(10).sum()))";
const HEAVY_OUT: &str = "45";
const TIMEOUT: Duration = Duration::from_secs(120);

async fn kernel_call(k: &mut Kernel, code: &str, want: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let r = k
        .execute(code, TIMEOUT)
        .await
        .map_err(|e| format!("kernel: {e}"))?;
    let took = t.elapsed();
    let out = r.stdout.render();
    if r.error.is_some() || r.timed_out || r.restarted || out.trim() != want {
        return Err(format!(
            "kernel: {code:?} gave {out:?} (error {:?}, timed out {}, restarted {})",
            r.error, r.timed_out, r.restarted
        ));
    }
    Ok(took)
}

async fn exec_call(sb: &Sandbox, req: ExecRequest, want: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let out = sb.exec(req).await.map_err(|e| format!("exec: {e}"))?;
    let took = t.elapsed();
    if !out.status.success() || out.stdout_str().trim() != want {
        return Err(format!(
            "exec gave {:?} ({:?}): {}",
            out.stdout_str(),
            out.status,
            out.stderr_str()
        ));
    }
    Ok(took)
}

fn python_c(python: &str, code: &str) -> ExecRequest {
    ExecRequest::argv([python, "-c", code]).cwd("/workspace")
}

fn run_code_file(code: &str) -> Result<ExecRequest, String> {
    program_request(Language::Python, code.to_string()).map_err(|e| e.to_string())
}

struct Side {
    label: &'static str,
    s: Summary,
}

fn table(title: &str, rows: &[Side]) {
    println!("  {title}");
    let base = rows[0].s;
    for r in rows {
        println!(
            "    {:<36} p50 {:>9} ms  p90 {:>9} ms  mean {:>9} ms  p50/kernel {:>6.1}  p90/kernel {:>6.1}",
            r.label,
            ms(r.s.p50),
            ms(r.s.p90),
            ms(r.s.mean),
            r.s.p50 / base.p50,
            r.s.p90 / base.p90
        );
    }
}

pub async fn run(args: &Args, workspace: &std::path::Path) -> Result<Json, String> {
    let calls = args.num("calls", 200)?;
    let heavy_calls = args.num("heavy-calls", 20)?;
    let cold = args.num("cold", 5)?;
    let warmup = args.num("warmup", 10)?;

    let mut config = SandboxConfig::new(workspace);
    config.network = Network::Off;
    if !cordon_lab::offer(&mut config) {
        return Err(format!(
            "no lab environment in {}: run `cordon lab setup` first",
            cordon_lab::cache_dir().display()
        ));
    }
    let sb = Sandbox::create(config)
        .await
        .map_err(|e| format!("sandbox: {e}"))?;
    let py = cordon_lab::SANDBOX_PYTHON;

    // The kernel's first calls, each on a fresh kernel.
    let (mut start, mut first, mut first_heavy, mut to_first) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..cold {
        let t = Instant::now();
        let mut k = Kernel::start(&sb, py)
            .await
            .map_err(|e| format!("kernel: {e}"))?;
        let started = t.elapsed();
        let one = kernel_call(&mut k, TRIVIAL_KERNEL, "2").await?;
        to_first.push(t.elapsed());
        start.push(started);
        first.push(one);
        first_heavy.push(kernel_call(&mut k, HEAVY, HEAVY_OUT).await?);
    }

    // One warm kernel, the heavy modules imported once, against execs.
    let mut k = Kernel::start(&sb, py)
        .await
        .map_err(|e| format!("kernel: {e}"))?;
    kernel_call(&mut k, HEAVY, HEAVY_OUT).await?;
    let (mut kern, mut pyc, mut file) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..warmup + calls {
        let a = kernel_call(&mut k, TRIVIAL_KERNEL, "2").await?;
        let b = exec_call(&sb, python_c("python3", TRIVIAL_PYTHON), "2").await?;
        let c = exec_call(&sb, run_code_file(TRIVIAL_PYTHON)?, "2").await?;
        if i >= warmup {
            kern.push(a);
            pyc.push(b);
            file.push(c);
        }
    }
    let (mut kheavy, mut pheavy) = (Vec::new(), Vec::new());
    for i in 0..1 + heavy_calls {
        let a = kernel_call(&mut k, HEAVY, HEAVY_OUT).await?;
        let b = exec_call(&sb, python_c(py, HEAVY), HEAVY_OUT).await?;
        if i >= 1 {
            kheavy.push(a);
            pheavy.push(b);
        }
    }
    drop(k);
    sb.close().await;

    let s = |v: &[Duration]| Summary::of(v);
    let (start, first, first_heavy, to_first) =
        (s(&start), s(&first), s(&first_heavy), s(&to_first));
    let (kern, pyc, file) = (s(&kern), s(&pyc), s(&file));
    let (kheavy, pheavy) = (s(&kheavy), s(&pheavy));

    println!("Python in the sandbox: the run_code kernel next to a fresh interpreter per call");
    table(
        &format!("trivial call, {calls} each, alternating"),
        &[
            Side {
                label: "kernel: x = 1 + 1; print(x)",
                s: kern,
            },
            Side {
                label: "exec: python3 -c 'print(1 + 1)'",
                s: pyc,
            },
            Side {
                label: "exec: run_code's file + python3",
                s: file,
            },
        ],
    );
    table(
        &format!("numpy + matplotlib.pyplot, {heavy_calls} each, alternating"),
        &[
            Side {
                label: "kernel: already imported",
                s: kheavy,
            },
            Side {
                label: "exec: python -c, imports each time",
                s: pheavy,
            },
        ],
    );
    println!("  the kernel's first calls ({cold} fresh kernels)");
    for (label, v) in [
        ("Kernel::start", start),
        ("first trivial call", first),
        ("start + first call", to_first),
        ("first heavy import", first_heavy),
    ] {
        println!(
            "    {label:<36} p50 {:>9} ms  p90 {:>9} ms",
            ms(v.p50),
            ms(v.p90)
        );
    }
    println!(
        "  start + first call = {:.0} trivial python3 -c calls; the kernel pays for itself after {:.0} trivial calls or {:.1} heavy ones",
        to_first.p50 / pyc.p50,
        to_first.p50 / (pyc.p50 - kern.p50),
        to_first.p50 / (pheavy.p50 - kheavy.p50)
    );
    Ok(Json::obj([
        ("calls", Json::Num(calls as f64)),
        ("heavy_calls", Json::Num(heavy_calls as f64)),
        ("trivial_kernel", kern.json()),
        ("trivial_python_c", pyc.json()),
        ("trivial_run_code_file", file.json()),
        ("trivial_ratio_p50", Json::Num(pyc.p50 / kern.p50)),
        ("trivial_ratio_p90", Json::Num(pyc.p90 / kern.p90)),
        ("heavy_kernel", kheavy.json()),
        ("heavy_python_c", pheavy.json()),
        ("heavy_ratio_p50", Json::Num(pheavy.p50 / kheavy.p50)),
        ("kernel_start", start.json()),
        ("kernel_first_call", first.json()),
        ("kernel_start_to_first_call", to_first.json()),
        ("kernel_first_heavy", first_heavy.json()),
    ]))
}
