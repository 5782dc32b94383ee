//! Claims and leases at the store, on both databases: every claim of a job
//! is in its record, written with the claim itself, so a worker that
//! stops right after claiming still leaves its run there; and a lost
//! claim's lease lapses into a `requeued` that the next claim follows.

use crate::common;

use std::time::Duration;

use common::*;
use cordon_server::job::{JobRequest, JobState};
use cordon_server::store::{ClaimTerms, Store};
use serde_json::json;

fn terms(lease: Duration) -> ClaimTerms {
    ClaimTerms {
        per_tenant: 10,
        lease,
        max_attempts: 2,
    }
}

async fn claims_are_recorded_with_the_claim(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let Some((url, _pg)) = database(db, tmp.path()) else {
        return;
    };
    let store = Store::open(&url).await.unwrap();
    let request = JobRequest::from_json(json!({"kind": "shell", "command": "true"})).unwrap();
    store.insert_job("job_c1", "t", &request).await.unwrap();

    // Worker a claims it, with a lease that lapses at once, and writes
    // nothing more: as if it stopped right after its claim.
    let a = store
        .claim("w-a", terms(Duration::ZERO))
        .await
        .unwrap()
        .expect("a queued job");
    assert_eq!(a.job.id, "job_c1");
    assert_eq!(a.job.attempts, 1);
    assert!(
        store
            .claim("w-b", terms(Duration::ZERO))
            .await
            .unwrap()
            .is_none()
    );
    let events = store.events_after("job_c1", 0, 100).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, "state");
    assert_eq!(events[0].data["worker"], "w-a");
    assert_eq!(events[0].seq, a.started.seq);

    // Its lease lapses; the job goes back to the queue; b claims it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.lapsed(10).await.unwrap(), ["job_c1"]);
    store
        .settle_lost("job_c1", None, "lost")
        .await
        .unwrap()
        .expect("settled");
    let b = store
        .claim("w-b", terms(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("queued again");
    assert_eq!(b.job.attempts, 2);
    let kinds: Vec<_> = store
        .events_after("job_c1", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.data["worker"].as_str().map(str::to_string)))
        .collect();
    assert_eq!(
        kinds,
        [
            ("state".to_string(), Some("w-a".to_string())),
            ("requeued".to_string(), None),
            ("state".to_string(), Some("w-b".to_string())),
        ]
    );

    // The limit that settles a lost run is the claiming worker's, kept
    // with its claim: the settler has no setting of its own (an API
    // process settled these with its default of 1 and failed them).
    store.insert_job("job_c2", "t", &request).await.unwrap();
    for (attempt, settled) in [(1, JobState::Queued), (2, JobState::Failed)] {
        let c = store
            .claim("w-c", terms(Duration::ZERO))
            .await
            .unwrap()
            .expect("job_c2 is queued");
        assert_eq!((c.job.id.as_str(), c.job.attempts), ("job_c2", attempt));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (state, _) = store
            .settle_lost("job_c2", None, "lost")
            .await
            .unwrap()
            .expect("settled");
        assert_eq!(state, settled, "after attempt {attempt}");
    }
    let row = store.job("t", "job_c2").await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Failed);
    let error = row.error.unwrap_or_default();
    assert!(error.contains("it ran 2 times"), "{error}");
}

/// A job started as it is stored (a pooled job's) is recorded as a claim
/// is, and only when the claim would take it next: its tenant is under its
/// limit and no queued job may run. A job held back by its own tenant's
/// limit does not stop another tenant's.
async fn a_job_starts_as_stored_only_where_a_claim_would_take_it(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let Some((url, _pg)) = database(db, tmp.path()) else {
        return;
    };
    let store = Store::open(&url).await.unwrap();
    let request = JobRequest::from_json(json!({"kind": "shell", "command": "true"})).unwrap();
    let one = ClaimTerms {
        per_tenant: 1,
        ..terms(Duration::from_secs(60))
    };

    // Nothing waits: it starts, with the claim's record.
    let a = store
        .start_job("job_s1", "a", &request, "w-a", one)
        .await
        .unwrap()
        .expect("started");
    assert_eq!(a.job.state, JobState::Running);
    assert_eq!(a.job.attempts, 1);
    let events = store.events_after("job_s1", 0, 100).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, "state");
    assert_eq!(events[0].data["worker"], "w-a");
    assert_eq!(events[0].seq, a.started.seq);
    assert_eq!(
        store
            .holder("job_s1")
            .await
            .unwrap()
            .unwrap()
            .1
            .unwrap()
            .worker,
        "w-a"
    );

    // Its tenant is at its limit: nothing is stored.
    assert!(
        store
            .start_job("job_s2", "a", &request, "w-a", one)
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.job("a", "job_s2").await.unwrap().is_none());

    // A queued job of that tenant may not run yet: another tenant's starts.
    store.insert_job("job_q1", "a", &request).await.unwrap();
    assert!(
        store
            .start_job("job_s3", "b", &request, "w-a", one)
            .await
            .unwrap()
            .is_some()
    );

    // A queued job that may run (tenant c is under its limit) goes first.
    store.insert_job("job_q2", "c", &request).await.unwrap();
    assert!(
        store
            .start_job("job_s4", "d", &request, "w-a", one)
            .await
            .unwrap()
            .is_none()
    );
    let claimed = store.claim("w-a", one).await.unwrap().expect("job_q2");
    assert_eq!(claimed.job.id, "job_q2");
    assert!(
        store
            .start_job("job_s4", "d", &request, "w-a", one)
            .await
            .unwrap()
            .is_some()
    );
}

/// A job the database says this worker runs, but which none of its slots
/// runs (lost between its claim and its run), is not renewed for ever by
/// the worker's heartbeat: seen so at two heartbeats, it is queued again,
/// and runs.
async fn a_job_held_but_run_by_no_slot_is_settled(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| c.lease = Duration::from_millis(600)).await else {
        return;
    };
    let t = s.token("acme").await;
    let shared = s.running.as_ref().unwrap().shared.clone();
    let request = JobRequest::from_json(json!({"kind": "shell", "command": "echo ran"})).unwrap();
    // As a start whose run was never spawned leaves it.
    let lost = shared
        .store
        .start_job(
            "job_0123456789abcdef01234567",
            "acme",
            &request,
            &shared.worker,
            terms(Duration::from_millis(600)),
        )
        .await
        .unwrap()
        .expect("started");
    let job = s.wait(&t, &lost.job.id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["stdout"], "ran\n");
    let events = shared
        .store
        .events_after(&lost.job.id, 0, 100)
        .await
        .unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "requeued" && e.data.to_string().contains("lost track")),
        "{events:?}"
    );
}

on_both!(
    a_job_held_but_run_by_no_slot_is_settled,
    claims_are_recorded_with_the_claim,
    a_job_starts_as_stored_only_where_a_claim_would_take_it
);
