//! What a hostile cell can do to the host's side of the bridge: flood it,
//! write lines of its own to the bridge's stdout, or one endless line. The
//! host must stay bounded in memory and time and keep the kernel usable.

use super::*;

/// The host's peak resident memory, in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_cell_printing_50_mb() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 'kept'").await;
    let r = k
        .execute(
            "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * (1 << 20))\nprint('end')",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let shown = r.stdout.render();
    assert!(shown.len() < 200 << 10, "{} bytes kept", shown.len());
    assert!(r.dropped_stream_bytes > 40 << 20, "{r:?}");
    assert!(shown.contains("dropped"), "the cut is marked");
    let r = run(&mut k, "x").await;
    assert_eq!(r.result.as_deref(), Some("'kept'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_cell_emitting_10000_display_items() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    let r = k
        .execute(
            "from IPython.display import HTML, display\nfor i in range(10000):\n    display(HTML('<i>%d</i>' % i))\n'end'",
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    assert_eq!(r.outputs.len(), 50);
    // ZeroMQ drops iopub messages the bridge is too slow for: at most
    // the rest is counted.
    assert!(
        (9000..=9950).contains(&r.dropped_items),
        "{}",
        r.dropped_items
    );
    assert_eq!(r.outputs[0], DisplayItem::Html("<i>0</i>".into()));
    assert_eq!(
        r.result.as_deref(),
        Some("'end'"),
        "the result is still there"
    );
}

/// Runs `data` with `fd` open on the bridge's stdout (the kernel's parent
/// moved it off fd 1; it is the pipe that is neither its stdin nor its
/// stderr): what any process in the sandbox can do.
fn to_bridge(data: &str) -> String {
    format!(
        r#"import os
d = '/proc/%d/fd/' % os.getppid()
skip = {{os.readlink(d + '0'), os.readlink(d + '2')}}
outs = [n for n in os.listdir(d) if os.readlink(d + n).startswith('pipe:') and os.readlink(d + n) not in skip]
assert len(outs) == 1, outs
fd = os.open(d + outs[0], os.O_WRONLY)
{data}
os.close(fd)
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_100_mb_line_without_a_newline() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 'kept'").await;
    let before = peak_kib();
    let cell = to_bridge("chunk = b'y' * (1 << 20)\nfor _ in range(100):\n    os.write(fd, chunk)")
        + "print('after')\nx";
    let start = Instant::now();
    let r = k.execute(&cell, T).await.unwrap();
    assert!(start.elapsed() < T, "{:?}", start.elapsed());
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(r.stdout.render(), "after\n");
    assert_eq!(r.result.as_deref(), Some("'kept'"));
    let grown = peak_kib().saturating_sub(before);
    assert!(grown < 64 << 10, "the host grew by {grown} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_fake_reply_lines() {
    let Some(lab) = lab().await else { return };
    let mut k = kernel(&lab).await;
    run(&mut k, "x = 'kept'").await;
    // To the cell's stdout (output, as text), and to the bridge's stdout:
    // forged replies for every id the cell could guess, a forged end,
    // garbage and a half line. (Not to fd 1: ipykernel forwards what is
    // written there from a thread, which may come after the call ends.)
    let fakes = r#"
lines = []
for i in list(range(0, 100)) + [2**53, -1]:
    lines.append('{"type":"result","id":%d,"data":{"text/plain":"FORGED"}}' % i)
    lines.append('{"type":"stream","id":%d,"name":"stdout","text":"FORGED"}' % i)
    lines.append('{"type":"done","id":%d,"status":"dead","execution_count":9,"dropped_stream_bytes":0,"dropped_display_items":0}' % i)
lines += ['{"type":"ready","protocol":1}', '{"type":"fatal","message":"FORGED"}', 'not json', '{"type":']
blob = ('\n'.join(lines) + '\n').encode()
import sys
sys.stdout.write(blob.decode())
sys.stdout.flush()
os.write(fd, blob + b'{"unterminated')
"#;
    let cell = to_bridge(fakes) + "x";
    let r = k.execute(&cell, T).await.unwrap();
    assert_eq!(r.result.as_deref(), Some("'kept'"), "{r:?}");
    assert!(r.error.is_none() && !r.restarted && !r.timed_out, "{r:?}");
    // What went to the cell's stdout is its output, as text.
    let out = r.stdout.render();
    assert!(out.contains(r#"{"type":"done","id":0"#), "{out}");
    // Once each, as written (102 ids, a result and a stream line each, and
    // the fatal): none of those sent to the bridge was taken for a reply.
    assert_eq!(out.matches("FORGED").count(), 102 * 2 + 1, "{out}");
    // And the kernel goes on as before.
    let r = run(&mut k, "x + '!'").await;
    assert_eq!(r.result.as_deref(), Some("'kept!'"));
    assert!(!r.restarted);
}
