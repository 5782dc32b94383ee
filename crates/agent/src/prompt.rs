//! The system prompt every front end gives the model: one text, with the
//! sandbox's network as it really is, so the model neither tries what
//! cannot work nor gives up on what can.

use cordon_sandbox::{Network, Sandbox};

const SYSTEM: &str = "You are cordon, a coding agent. Every command you run and every file you \
touch is inside an isolated sandbox: the user's project is at /workspace, there is no network, \
and /tmp is scratch space. Work step by step, check your work by running it, and finish with a \
short summary of what you did.";

/// The hosts `sandbox`'s broker lets through now, its presets expanded
/// (`@python` is pypi.org and the hosts of pip's configuration): what the
/// prompt names, since the model knows hosts, not cordon's presets.
pub fn allowed(sandbox: &Sandbox) -> Vec<String> {
    sandbox
        .network()
        .map(|n| {
            n.policy
                .load()
                .rules()
                .iter()
                .map(ToString::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The prompt for a sandbox whose network is `network`; `allow`: the
/// hosts a brokered network lets through ([`allowed`]).
pub fn system(network: Network, allow: &[String]) -> String {
    let what = match network {
        Network::Off => return SYSTEM.into(),
        Network::Loopback => {
            "there is no network beyond loopback (servers you start can be reached on 127.0.0.1)"
                .to_string()
        }
        Network::Full => "the network is the host's own (the user chose it)".to_string(),
        Network::Allow => format!(
            "the network is reachable only through a proxy that the environment's proxy \
             variables already point to (pip, npm, cargo, git and curl use it), and only for \
             these hosts: {}. A refused connection is named in the tool's result; ask the \
             user if you need another host",
            allow.join(", ")
        ),
    };
    SYSTEM.replace("there is no network", &what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_says_what_the_network_is() {
        assert!(system(Network::Off, &[]).contains("there is no network,"));
        let allow = system(Network::Allow, &["@python".into(), "a.example".into()]);
        assert!(
            allow.contains("only for these hosts: @python, a.example."),
            "{allow}"
        );
        assert!(!allow.contains("there is no network"));
        assert!(system(Network::Loopback, &[]).contains("beyond loopback"));
    }
}
