//! The network in the session log: how many of the broker's refusals a
//! tool batch records, and each change to the sandbox's policy.

use crate::record::{PolicyRecord, SessionRecord};

/// Refusals recorded per tool batch at most: a retry loop must not flood
/// the log.
pub(crate) const MAX_RECORDS: usize = 20;

/// Records every change of `policy` in the log `recorder` writes, until
/// the agent (the recorder's owner) or the sandbox's broker is gone. A
/// change is recorded when it is made, mid-turn or between turns.
pub(crate) fn record_changes(
    policy: &cordon_net::PolicyHandle,
    recorder: std::sync::Weak<crate::recorder::Recorder>,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("no runtime: network policy changes will not be logged");
        return;
    };
    let mut rx = policy.subscribe();
    let mut before = rx.borrow_and_update().clone();
    rt.spawn(async move {
        while rx.changed().await.is_ok() {
            let after = rx.borrow_and_update().clone();
            let Some(recorder) = recorder.upgrade() else {
                return;
            };
            if *after != *before {
                recorder.append(&SessionRecord::NetworkPolicy(PolicyRecord::between(
                    &before, &after,
                )));
            }
            before = after;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::SessionLog;
    use cordon_net::{Policy, PolicyHandle};
    use std::sync::Arc;

    #[tokio::test]
    async fn each_change_of_the_policy_is_a_record_and_a_dropped_agent_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let recorder = Arc::new(crate::recorder::Recorder::default());
        *recorder.log.lock().unwrap() = Some(SessionLog::create(&path).unwrap());
        let handle = PolicyHandle::new(Policy::parse(&["a.example"], false).unwrap());
        record_changes(&handle, Arc::downgrade(&recorder));

        handle.set(Policy::parse(&["a.example", "b.example:8443"], false).unwrap());
        let read = || {
            crate::log::load::<SessionRecord>(&path)
                .unwrap()
                .0
                .into_iter()
                .filter_map(|r| match r.data {
                    SessionRecord::NetworkPolicy(p) => Some(p),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while read().is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let records = read();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].added, ["b.example:8443"]);
        assert!(records[0].removed.is_empty());
        assert_eq!(records[0].allow, ["a.example", "b.example:8443"]);

        handle.set(Policy::parse(&["b.example:8443"], false).unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while read().len() < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let records = read();
        assert_eq!(records[1].removed, ["a.example"]);
        assert!(records[1].added.is_empty());

        // The agent gone, later changes are nobody's to record.
        drop(recorder);
        handle.set(Policy::deny_all());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(read().len(), 2);
    }
}
