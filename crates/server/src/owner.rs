//! What owns a sandbox and a workspace in this server: a job, an API
//! session, or a sandbox of the sandbox API (which owns itself). The registries of live sandboxes and network policies are
//! keyed by it, and every answer about one names it the same way, so a new
//! kind of owner is one variant here and the compiler lists the rest.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    Job(String),
    Session(String),
    Sandbox(String),
}

impl Owner {
    pub fn id(&self) -> &str {
        match self {
            Owner::Job(id) | Owner::Session(id) | Owner::Sandbox(id) => id,
        }
    }

    /// The word for its kind, as answers use it ("no such job").
    pub fn noun(&self) -> &'static str {
        match self {
            Owner::Job(_) => "job",
            Owner::Session(_) => "session",
            Owner::Sandbox(_) => "sandbox",
        }
    }

    /// Its resource's path under `/v1/`, without the slashes around it.
    pub fn collection(&self) -> &'static str {
        match self {
            Owner::Job(_) => "jobs",
            Owner::Session(_) => "sessions",
            Owner::Sandbox(_) => "sandboxes",
        }
    }

    /// `jobs/ID`: where its routes are, under `/v1/`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.collection(), self.id())
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.noun(), self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_named_the_same_way_everywhere() {
        let job = Owner::Job("a1".into());
        assert_eq!((job.noun(), job.path()), ("job", "jobs/a1".into()));
        assert_eq!(job.to_string(), "job a1");
        let session = Owner::Session("b2".into());
        assert_eq!(session.path(), "sessions/b2");
        assert_ne!(job, Owner::Session("a1".into()));
    }
}
