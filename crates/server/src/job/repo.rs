//! A job's `repo`, as a request names it. What reaching it takes (the
//! tenant's ceiling, its login) is the `repos` module's.

use cordon_git::{Endpoint, RepoSpec};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// `URL[#REF]`: an `https://` or `http://` repository, and the branch, tag
/// or commit to start from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RepoUrl(RepoSpec);

impl TryFrom<String> for RepoUrl {
    type Error = String;
    fn try_from(s: String) -> Result<RepoUrl, String> {
        let spec: RepoSpec = s
            .parse()
            .map_err(|e: cordon_git::RemoteError| e.to_string())?;
        if spec.endpoint().is_none() {
            return Err(format!(
                "{}: a job's repository is cloned over https:// or http:// (a path, file://, \
                 ssh:// and git:// are refused: the first two would read the worker's own \
                 disk, ssh:// would use its keys)",
                cordon_tools::printable(&spec.url)
            ));
        }
        Ok(RepoUrl(spec))
    }
}

impl From<RepoUrl> for String {
    fn from(r: RepoUrl) -> String {
        r.0.to_string()
    }
}

impl RepoUrl {
    pub fn spec(&self) -> &RepoSpec {
        &self.0
    }

    pub fn endpoint(&self) -> Endpoint {
        self.0.endpoint().expect("checked when read")
    }
}

impl PartialSchema for RepoUrl {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "URL[#REF]: an https:// or http:// repository, cloned into the workspace before \
                 the job runs, on a branch `cordon/<job id>` started at REF (a branch, tag or \
                 commit; default: the remote's default branch). The worker clones with the \
                 tenant's stored login for the host (`PUT /v1/git-credentials/{host}`); the \
                 host must be within the tenant's network ceiling.",
            ))
            .examples([serde_json::Value::String(
                "https://github.com/acme/app.git#main".into(),
            )])
            .into()
    }
}
impl ToSchema for RepoUrl {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_takes_only_http_repositories() {
        for ok in [
            "https://github.com/o/r.git#main",
            "http://10.0.0.1:3000/o/r",
        ] {
            let r = RepoUrl::try_from(ok.to_string()).unwrap();
            assert_eq!(String::from(r), ok);
        }
        for bad in [
            "file:///srv/r",
            "/srv/r",
            "ssh://h/o/r",
            "git@h:o/r",
            "git://h/o/r",
        ] {
            assert!(RepoUrl::try_from(bad.to_string()).is_err(), "{bad}");
        }
    }
}
