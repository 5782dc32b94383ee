//! A session's network policy as its log has it: what it was created with,
//! as the API's changes left it (see `owned::network`).

use super::*;

/// A session's network from its log: the mode and hosts it was created
/// with, as the last `network_policy` record left them.
pub(crate) fn logged_network<'a>(
    records: impl Iterator<Item = &'a SessionRecord>,
) -> (cordon_sandbox::Network, Option<cordon_net::Policy>) {
    let mut network = cordon_sandbox::Network::Off;
    let mut policy = None;
    for r in records {
        match r {
            SessionRecord::SessionStarted(s) => {
                network = s.network.unwrap_or_default();
                if network == cordon_sandbox::Network::Allow {
                    policy = cordon_net::Policy::parse(
                        s.allow.as_deref().unwrap_or_default(),
                        s.allow_private.unwrap_or(false),
                    )
                    .ok();
                }
            }
            SessionRecord::NetworkPolicy(rec) if network == cordon_sandbox::Network::Allow => {
                if let Ok(p) = cordon_net::Policy::parse(&rec.allow, rec.allow_private) {
                    policy = Some(p);
                }
            }
            _ => {}
        }
    }
    (network, policy)
}

pub(crate) fn read_log(shared: &Shared, id: &str) -> Result<Vec<SessionRecord>, ApiError> {
    let path = dir(shared, id).join("session.jsonl");
    Ok(load_log(&path, id)?.into_iter().map(|r| r.data).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's pinned log (see its `checkpoints::fixture`): created
    /// with `network: allow`, changed once since.
    #[test]
    fn the_agents_fixture_reads_as_it_always_has() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../agent/tests/fixtures/session.jsonl");
        let (records, _) = cordon_agent::log::load::<SessionRecord>(&path).unwrap();
        let (network, policy) = logged_network(records.iter().map(|r| &r.data));
        assert_eq!(network, cordon_sandbox::Network::Allow);
        let rules: Vec<String> = policy
            .expect("a policy")
            .rules()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(rules, ["example.com:443", "api.example.org"]);
        assert_eq!(
            started_display(records.iter().map(|r| &r.data)),
            Some("1280x800".parse().unwrap())
        );
        assert_eq!(
            started(records.iter().map(|r| &r.data)).and_then(|s| s.image.as_deref()),
            Some("ubuntu:24.04")
        );
    }
}
