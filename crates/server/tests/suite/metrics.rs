//! `/metrics` on the metrics listener: the queue depth an autoscaler reads,
//! jobs by state, durations, sandbox starts and leases, in Prometheus'
//! text format; and nothing of it on the API's own port.

use crate::common;

use common::*;

async fn metrics(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.workers = 1;
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let held = s
        .submit(
            &t,
            shell("while [ ! -f /workspace/release ]; do sleep 0.05; done"),
        )
        .await;
    s.wait_running(&t, &held).await;
    let queued = [
        s.submit(&t, shell("true")).await,
        s.submit(&t, shell("exit 3")).await,
    ];
    let text = scrape(&s).await;
    assert_eq!(sample(&text, "cordon_jobs_queued"), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, r#"cordon_jobs{state="running"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "cordon_worker_leases"), Some(1.0), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    s.release(&t, &held).await;
    for id in [&held, &queued[0], &queued[1]] {
        s.wait(&t, id).await;
    }
    let text = scrape(&s).await;
    assert_eq!(sample(&text, "cordon_jobs_queued"), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, r#"cordon_jobs{state="succeeded"}"#),
        Some(2.0)
    );
    assert_eq!(sample(&text, r#"cordon_jobs{state="failed"}"#), Some(1.0));
    assert_eq!(sample(&text, "cordon_worker_leases"), Some(0.0));
    assert_eq!(
        sample(
            &text,
            r#"cordon_job_duration_seconds_count{kind="shell",state="succeeded"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"cordon_sandbox_starts_total{backend="native",result="ok"}"#
        ),
        Some(3.0),
        "{text}"
    );

    // Not on the API's port, where everything else needs a token.
    let r = s.client.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

on_both!(metrics);
