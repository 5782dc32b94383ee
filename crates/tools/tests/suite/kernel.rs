//! The Jupyter kernel behind `run_code`, in a real (native) sandbox with
//! the loopback down: state across calls, output kinds, timeouts that
//! interrupt, restarts, dead kernels, and what a hostile cell can do to the
//! host's side of the bridge.
//!
//! Needs the lab environment (`cordon lab setup`, which scripts/test runs),
//! or a venv with ipykernel and jupyter_client at `CORDON_TEST_JUPYTER`,
//! mounted read-only at /opt/cordon/jupyter, and the `cordon-supervisor`
//! binary beside the test executable (`cargo build -p cordon-sandbox --bins`).

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon_sandbox::{BackendKind, BindMount, ExecRequest, Network, Sandbox, SandboxConfig};
use cordon_tools::kernel::{DisplayItem, ExecutionResult, Kernel, KernelError};

use common::supervisor;

const PYTHON: &str = cordon_lab::SANDBOX_PYTHON;
const T: Duration = Duration::from_secs(30);

/// The test venv on the host, or `None` (outside CI) to skip.
fn venv() -> Option<PathBuf> {
    let p: PathBuf = match std::env::var_os("CORDON_TEST_JUPYTER") {
        Some(p) => p.into(),
        None => match cordon_lab::installed(&cordon_lab::cache_dir()) {
            Some(lab) => lab.dir,
            None => cordon_lab::cache_dir(),
        },
    };
    if p.join("pyvenv.cfg").exists() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "no lab environment in {}: run `cordon lab setup` (scripts/test does)",
        p.display()
    );
    eprintln!("skipped: no lab environment in {}", p.display());
    None
}

struct Lab {
    _dir: tempfile::TempDir,
    sandbox: Sandbox,
}

async fn lab() -> Option<Lab> {
    lab_on(BackendKind::Native).await
}

async fn lab_on(backend: BackendKind) -> Option<Lab> {
    let venv = venv()?;
    let dir = tempfile::tempdir().unwrap();
    let mut config = SandboxConfig::new(dir.path());
    config.supervisor = Some(supervisor());
    config.network = Network::Off;
    config.backend = backend;
    config.binds.push(BindMount {
        source: venv,
        target: "/opt/cordon/jupyter".into(),
        writable: false,
    });
    let sandbox = Sandbox::create(config).await.expect("create sandbox");
    Some(Lab { _dir: dir, sandbox })
}

async fn kernel(lab: &Lab) -> Kernel {
    Kernel::start(&lab.sandbox, PYTHON)
        .await
        .expect("kernel starts")
}

async fn run(k: &mut Kernel, code: &str) -> ExecutionResult {
    tokio::time::timeout(Duration::from_secs(120), k.execute(code, T))
        .await
        .expect("execute returns")
        .unwrap_or_else(|e| panic!("{code}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_venv_works_read_only_at_its_sandbox_path() {
    let Some(lab) = lab().await else { return };
    let out = lab
        .sandbox
        .exec(ExecRequest::argv([
            PYTHON,
            "-c",
            "import sys, ipykernel, jupyter_client; print(sys.prefix); open(sys.prefix + '/x', 'w')",
        ]))
        .await
        .unwrap();
    assert!(
        out.stdout_str().starts_with("/opt/cordon/jupyter\n"),
        "{out:?}"
    );
    assert!(
        out.stderr_str().contains("Read-only file system"),
        "{out:?}"
    );
    // The loopback is down: a kernel on TCP could not work here.
    let out = lab
        .sandbox
        .exec(ExecRequest::argv([
            PYTHON,
            "-c",
            "import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)",
        ]))
        .await
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_between_calls_and_streams_come_apart() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let r = run(&mut k, "import json\nx = 41").await;
    assert!(r.error.is_none() && r.result.is_none(), "{r:?}");
    let r = run(
        &mut k,
        "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\njson.dumps(x + 1)",
    )
    .await;
    assert_eq!(r.stdout.render(), "to out\n");
    assert_eq!(r.stderr.render(), "to err\n");
    assert_eq!(r.result.as_deref(), Some("'42'"));
    assert_eq!(r.execution_count, Some(2));
    assert!(
        !r.timed_out && !r.restarted && r.outputs.is_empty(),
        "{r:?}"
    );
}

/// The microVM shares the venv read-only like the native backend binds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_runs_in_a_microvm() {
    let Some(lab) = lab_on(BackendKind::Microvm).await else {
        return;
    };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 41").await;
    let r = k
        .execute("while True: pass", Duration::from_secs(2))
        .await
        .unwrap();
    assert!(r.timed_out && !r.restarted, "{r:?}");
    let r = run(&mut k, "print('out')\nx + 1").await;
    assert_eq!(r.stdout.render(), "out\n");
    assert_eq!(r.result.as_deref(), Some("42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exception_comes_back_with_a_plain_traceback() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let r = run(&mut k, "def f():\n    return 1 / 0\nprint('before')\nf()").await;
    assert_eq!(r.stdout.render(), "before\n");
    let e = r.error.expect("an error");
    assert_eq!(e.ename, "ZeroDivisionError");
    assert_eq!(e.evalue, "division by zero");
    let tb = e.traceback.join("\n");
    assert!(tb.contains("return 1 / 0"), "{tb}");
    assert!(!tb.contains('\u{1b}'), "ANSI escapes left: {tb:?}");
}

/// A 2x1 PNG written by hand (no matplotlib here).
const PNG_CELL: &str = r#"
import struct, zlib
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
png = (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 2, 1, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(b'\x00\xff\x00\x00\x00\x00\xff')) + chunk(b'IEND', b''))
from IPython.display import Image, SVG, HTML, display
display(Image(data=png))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg"><circle r="1"/></svg>'))
display(HTML('<b>bold</b>'))
display('plain text')
Image(data=png)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn display_data_comes_back_as_what_it_is() {
    use base64::Engine;
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let r = run(&mut k, PNG_CELL).await;
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(r.outputs.len(), 5, "{:?}", r.outputs);
    let DisplayItem::Image(img) = &r.outputs[0] else {
        panic!("{:?}", r.outputs[0])
    };
    assert_eq!(img.media_type, "image/png");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&img.data)
        .unwrap();
    let info = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    assert_eq!((info.info().width, info.info().height), (2, 1));
    assert!(matches!(&r.outputs[1], DisplayItem::Svg(s) if s.contains("<circle")));
    assert_eq!(r.outputs[2], DisplayItem::Html("<b>bold</b>".into()));
    assert_eq!(r.outputs[3], DisplayItem::Text("'plain text'".into()));
    // The last expression: its image, and its text form as the result.
    assert_eq!(r.outputs[4], r.outputs[0]);
    assert_eq!(
        r.result.as_deref(),
        Some("<IPython.core.display.Image object>")
    );
}

/// The Debian matplotlib (scripts/packages.txt), seen through the
/// environment's system site packages, draws inline: a plot is a PNG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matplotlib_plot_comes_back_as_a_png() {
    use base64::Engine;
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let r = run(
        &mut k,
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('rise')\nplt.show()",
    )
    .await;
    assert!(r.error.is_none(), "{r:?}");
    let images: Vec<_> = r
        .outputs
        .iter()
        .filter_map(|o| match o {
            DisplayItem::Image(i) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(images.len(), 1, "{:?}", r.outputs);
    assert_eq!(images[0].media_type, "image/png");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&images[0].data)
        .unwrap();
    let info = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    assert!(info.info().width > 100 && info.info().height > 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_interrupts_and_the_state_survives() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 'kept'").await;
    let start = Instant::now();
    let r = k
        .execute("print('looping')\nwhile True: pass", Duration::from_secs(2))
        .await
        .unwrap();
    assert!(r.timed_out && !r.restarted, "{r:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.stdout.render(), "looping\n");
    assert_eq!(r.error.unwrap().ename, "KeyboardInterrupt");
    let r = run(&mut k, "x").await;
    assert_eq!(r.result.as_deref(), Some("'kept'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_deaf_to_the_interrupt_is_restarted() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let code =
        "import signal\nx = 1\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass";
    let r = k.execute(code, Duration::from_secs(2)).await.unwrap();
    assert!(r.timed_out && r.restarted, "{r:?}");
    let r = run(&mut k, "'x' in globals()").await;
    assert_eq!(r.result.as_deref(), Some("False"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_over_the_memory_limit_is_reported_and_replaced() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    // Beyond the sandbox's 512 MiB, touched page by page.
    let e = k.execute("hog = b'x' * (1 << 30)", T).await.unwrap_err();
    // The memory cgroup's killer picks the kernel, the biggest process;
    // should it pick the bridge, that is reported too.
    assert!(
        matches!(e, KernelError::Died | KernelError::BridgeExited(_)),
        "{e}"
    );
    let r = run(&mut k, "1 + 1").await;
    assert!(r.restarted);
    assert_eq!(r.result.as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_loses_the_state() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 1").await;
    k.restart().await.unwrap();
    let r = run(&mut k, "x").await;
    assert_eq!(r.error.unwrap().ename, "NameError");
    assert_eq!(r.execution_count, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_kernel_is_reported_and_replaced() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 1").await;
    let start = Instant::now();
    let e = k
        .execute("import os\nos.kill(os.getpid(), 9)", T)
        .await
        .unwrap_err();
    assert!(matches!(e, KernelError::Died), "{e}");
    assert!(e.to_string().contains("Call again"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(10));
    let r = run(&mut k, "y = 2\ny").await;
    assert!(r.restarted, "{r:?}");
    assert_eq!(r.result.as_deref(), Some("2"));
    let r = run(&mut k, "x").await;
    assert_eq!(r.error.unwrap().ename, "NameError");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_bridge_is_reported_and_replaced() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let e = k
        .execute("import os\nos.kill(os.getppid(), 9)", T)
        .await
        .unwrap_err();
    assert!(matches!(e, KernelError::BridgeExited(_)), "{e}");
    let r = run(&mut k, "1 + 1").await;
    assert!(r.restarted, "{r:?}");
    assert_eq!(r.result.as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_a_fresh_kernel_for_the_next() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 1").await;
    // The caller gives up (its turn was cancelled) while the code runs.
    let gone = tokio::time::timeout(Duration::from_secs(2), k.execute("while True: pass", T)).await;
    assert!(gone.is_err());
    let r = run(&mut k, "'x' in globals()").await;
    assert!(r.restarted, "{r:?}");
    assert_eq!(r.result.as_deref(), Some("False"));
}

/// Python that lists the kernels running in the sandbox.
const KERNELS: &str = "import os\nfor p in os.listdir('/proc'):\n    try:\n        c = open('/proc/%s/cmdline' % p, 'rb').read()\n    except OSError:\n        continue\n    if b'ipykernel' + b'_launcher' in c:\n        print(p)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_kernel_ends_it() {
    let Some(lab) = lab().await else { return };
    let k = kernel(&lab).await;
    let count = || async {
        let out = lab
            .sandbox
            .exec(ExecRequest::argv([PYTHON, "-c", KERNELS]))
            .await
            .unwrap();
        out.stdout_str().lines().count()
    };
    assert_eq!(count().await, 1);
    drop(k);
    let start = Instant::now();
    while count().await > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the kernel outlived its bridge"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[path = "kernel/attacks.rs"]
mod attacks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_arrives_while_the_code_runs() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let seen: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>> = Default::default();
    let log = seen.clone();
    let live: cordon_tools::Progress = std::sync::Arc::new(move |stream, data: &[u8]| {
        log.lock().unwrap().push((
            Instant::now(),
            format!("{stream:?}:{}", String::from_utf8_lossy(data)),
        ));
    });
    let code = "import sys, time\nprint('first', flush=True)\ntime.sleep(2)\nprint('oops', file=sys.stderr, flush=True)\nprint('second')";
    let r = k.execute_live(code, T, Some(live)).await.unwrap();
    let done = Instant::now();
    assert_eq!(r.stdout.render(), "first\nsecond\n");
    let seen = seen.lock().unwrap();
    let text: String = seen.iter().map(|(_, t)| t.as_str()).collect();
    // Both streams, in the order each was written.
    assert!(text.contains("Stderr:oops\n"), "{text}");
    assert_eq!(
        text.replace("Stderr:oops\n", ""),
        "Stdout:first\nStdout:second\n"
    );
    let first = seen[0].0;
    assert!(
        done - first >= Duration::from_millis(1500),
        "`first` came only {:?} before the end",
        done - first
    );
}
