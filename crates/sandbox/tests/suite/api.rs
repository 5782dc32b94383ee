//! The library API of a live sandbox session, exercised for real: every test
//! starts actual sandboxes through the native backend. The same tests run
//! against the microvm backend in api_microvm.rs.

const BACKEND: cordon_sandbox::BackendKind = cordon_sandbox::BackendKind::Native;

include!("semantics/body.rs");

/// As root with cgroup v1 limits (this machine's kind), a start spaced from
/// the last paid an RCU grace period (~7 ms) to move its supervisor into
/// its cgroups. The first sandbox has the kernel favour cgroup changes, and
/// a move after an idle pause no longer waits.
#[tokio::test]
async fn a_start_as_root_does_not_wait_for_the_kernel_to_join_its_cgroups() {
    use cordon_sandbox::cgroup::{LimitMechanism, attach_report, detect};
    let LimitMechanism::V1 { memory, .. } = detect() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root with cgroup v1 limits"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sb = Sandbox::create(config(dir.path())).await.unwrap();
    sb.close().await;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(" - cgroup") && l.contains("favordynmods")),
        "{mounts}"
    );
    assert!(
        attach_report().starts_with("without waiting"),
        "{}",
        attach_report()
    );

    // What a spaced start does: a process moved into a fresh memory cgroup
    // after an idle pause. A grace period is never under ~4 ms here (one
    // tick); the favoured move takes a fraction of a millisecond.
    let mut fastest = std::time::Duration::MAX;
    for i in 0..5 {
        let cg = memory.join(format!("cordon-test-{}-{i}", std::process::id()));
        std::fs::create_dir(&cg).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let t = std::time::Instant::now();
        std::fs::write(cg.join("cgroup.procs"), child.id().to_string()).unwrap();
        fastest = fastest.min(t.elapsed());
        child.kill().unwrap();
        child.wait().unwrap();
        // The kernel may take a moment to let go of the dead process.
        for _ in 0..100 {
            if std::fs::remove_dir(&cg).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    assert!(
        fastest < std::time::Duration::from_micros(2500),
        "the fastest of five spaced moves took {fastest:?}"
    );
}

/// A host started as `nohup cordon serve &` ignores SIGHUP, SIGINT and
/// SIGQUIT; its sandboxes' commands must not inherit that, or a command's
/// trap on SIGINT never fires and an interrupt is lost.
#[tokio::test]
async fn a_command_does_not_inherit_the_signals_its_host_ignores() {
    // SAFETY: ignoring SIGQUIT in this test process, as a backgrounded
    // host's shell would; no test here expects it.
    unsafe { libc::signal(libc::SIGQUIT, libc::SIG_IGN) };
    let dir = tempfile::tempdir().unwrap();
    let sb = Sandbox::create(config(dir.path())).await.unwrap();
    let out = sb
        .exec(ExecRequest::argv(["grep", "^SigIgn", "/proc/self/status"]))
        .await
        .unwrap();
    sb.close().await;
    let ignored = out.stdout_str();
    let mask =
        u64::from_str_radix(ignored.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap();
    assert_eq!(mask & (1 << (libc::SIGQUIT - 1)), 0, "{ignored}");
}
