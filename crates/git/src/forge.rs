//! `create_pull_request`: a pull request from the session's branch, opened
//! by cordon on the host through the forge's REST API with the user's
//! token (GitHub's, and Gitea's and Forgejo's, which share its shape). The
//! token is read on the host and never reaches the sandbox.

use std::sync::Arc;

use cordon_tools::{Tool, ToolContext, ToolFuture, ToolOutput, TypedTool};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Which API a forge speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgeKind {
    /// `POST {api}/repos/{owner}/{repo}/pulls`, `Authorization: Bearer`.
    GitHub,
    /// The same under `/api/v1`, `Authorization: token`.
    Gitea,
}

/// A forge, and the repository on it.
#[derive(Clone)]
pub struct Forge {
    kind: ForgeKind,
    /// The API's base URL (GitHub: `https://api.github.com`; Gitea: the
    /// site's, with `/api/v1` added here).
    api: String,
    token: String,
    owner: String,
    repo: String,
    /// For someone other than the host's user: the addresses the API's
    /// host was checked to resolve to, the only ones connected to, and no
    /// redirect followed.
    confined: Option<Vec<std::net::IpAddr>>,
}

impl std::fmt::Debug for Forge {
    // The token is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forge")
            .field("kind", &self.kind)
            .field("api", &self.api)
            .field("owner", &self.owner)
            .field("repo", &self.repo)
            .finish_non_exhaustive()
    }
}

/// A pull request opened.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PullRequest {
    pub number: u64,
    pub html_url: String,
}

#[derive(Serialize)]
struct NewPull<'a> {
    title: &'a str,
    body: &'a str,
    head: &'a str,
    base: &'a str,
}

#[derive(Deserialize)]
struct ForgeMessage {
    #[serde(default)]
    message: String,
}

/// The owner and repository of a forge URL (`https://host/OWNER/REPO.git`,
/// `git@host:OWNER/REPO.git`), and its host.
fn owner_repo(url: &str) -> Option<(String, String, String)> {
    let rest = match url.split_once("://") {
        Some((_, rest)) => rest
            .split_once('/')
            .map(|(h, p)| (h.to_string(), p.to_string()))?,
        None => {
            let (h, p) = url.split_once(':')?;
            (h.to_string(), p.to_string())
        }
    };
    let host = rest.0.rsplit('@').next()?.to_string();
    let path = rest.1.trim_end_matches('/').trim_end_matches(".git");
    let (owner, repo) = path.rsplit_once('/')?;
    let owner = owner.rsplit('/').next()?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    (ok(owner) && ok(repo)).then(|| (host, owner.to_string(), repo.to_string()))
}

impl Forge {
    /// The forge `url` lives on, reached at `api` (default: GitHub's for
    /// github.com, else Gitea's at the same host), with `token`.
    pub fn for_repository(
        url: &str,
        api: Option<&str>,
        kind: Option<ForgeKind>,
        token: String,
    ) -> Result<Forge, String> {
        let (host, owner, repo) = owner_repo(url).ok_or_else(|| {
            format!("{url}: cannot tell the owner and the repository from this URL, so no pull request can be opened")
        })?;
        let host = host.split(':').next().unwrap_or(&host).to_string();
        let kind = kind.unwrap_or(if host == "github.com" {
            ForgeKind::GitHub
        } else {
            ForgeKind::Gitea
        });
        let base = match api {
            Some(a) => a.trim_end_matches('/').to_string(),
            None if kind == ForgeKind::GitHub => "https://api.github.com".to_string(),
            None => format!("https://{host}"),
        };
        let api = match kind {
            ForgeKind::GitHub => base,
            ForgeKind::Gitea if base.ends_with("/api/v1") => base,
            ForgeKind::Gitea => format!("{base}/api/v1"),
        };
        Ok(Forge {
            kind,
            api,
            token,
            owner,
            repo,
            confined: None,
        })
    }

    /// The API's base URL.
    pub fn api(&self) -> &str {
        &self.api
    }

    /// This forge reached only at `addrs` (what its API's host name was
    /// checked to resolve to), following no redirect.
    pub fn confined(mut self, addrs: Vec<std::net::IpAddr>) -> Forge {
        self.confined = Some(addrs);
        self
    }

    fn client(&self) -> Result<reqwest::Client, String> {
        let mut b = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .user_agent("cordon");
        if let Some(addrs) = &self.confined {
            b = b.redirect(reqwest::redirect::Policy::none()).no_proxy();
            if let Some(e) = crate::access::Endpoint::of_url(&self.api)
                && e.ip().is_none()
            {
                let at: Vec<std::net::SocketAddr> = addrs
                    .iter()
                    .map(|ip| std::net::SocketAddr::new(*ip, e.port))
                    .collect();
                b = b.resolve_to_addrs(&e.host, &at);
            }
        }
        b.build().map_err(|e| e.to_string())
    }

    /// Opens a pull request from `head` into `base`.
    pub async fn open(
        &self,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<PullRequest, String> {
        let url = format!("{}/repos/{}/{}/pulls", self.api, self.owner, self.repo);
        let auth = match self.kind {
            ForgeKind::GitHub => format!("Bearer {}", self.token),
            ForgeKind::Gitea => format!("token {}", self.token),
        };
        let client = self.client()?;
        let resp = client
            .post(&url)
            .header("authorization", auth)
            .header("accept", "application/vnd.github+json")
            .json(&NewPull {
                title,
                body,
                head,
                base,
            })
            .send()
            .await
            .map_err(|e| format!("cannot reach {}: {e}", self.api))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            let said = serde_json::from_str::<ForgeMessage>(&text)
                .map(|m| m.message)
                .unwrap_or_default();
            return Err(format!(
                "{} answered {status}: {}",
                self.api,
                cordon_tools::printable(&said.chars().take(500).collect::<String>())
            ));
        }
        serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} answered something cordon does not understand: {e}",
                self.api
            )
        })
    }
}

/// The model's `create_pull_request` tool.
pub struct CreatePullRequestTool {
    /// The forge, or why there is none.
    forge: Result<Forge, String>,
    head: String,
    base: String,
    allowed: bool,
}

impl CreatePullRequestTool {
    /// From the session's `branch` into `base`; `forge` is why there is
    /// none when the user gave no token (the tool then says so).
    pub fn tool(
        forge: Result<Forge, String>,
        branch: impl Into<String>,
        base: impl Into<String>,
        allowed: bool,
    ) -> Arc<dyn Tool> {
        Arc::new(CreatePullRequestTool {
            forge,
            head: branch.into(),
            base: base.into(),
            allowed,
        })
    }
}

/// `create_pull_request`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequestInput {
    title: String,
    #[serde(default)]
    body: String,
}

impl TypedTool for CreatePullRequestTool {
    const NAME: &'static str = "create_pull_request";
    const READ_ONLY: bool = false;
    type Input = PullRequestInput;

    fn description(&self) -> &str {
        "Open a pull request from this session's branch into the branch the session started \
         from, on the forge (GitHub, Gitea, Forgejo), as the user. Push first with git_push. \
         Give a title and a body that says what changed and why."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "body": {"type": "string"}
            },
            "required": ["title"],
            "additionalProperties": false
        })
    }

    fn label(&self, input: &PullRequestInput) -> String {
        format!("{} into {}: {}", self.head, self.base, input.title)
    }

    fn run<'a>(&'a self, _ctx: &'a ToolContext, input: PullRequestInput) -> ToolFuture<'a> {
        Box::pin(async move {
            let title = input.title.trim();
            let body = input.body.as_str();
            if title.is_empty() || title.len() > 256 {
                return ToolOutput::error(
                    "create_pull_request needs {\"title\": \"...\"} (up to 256 characters) and may take a \"body\"",
                );
            }
            if body.len() > 65_536 {
                return ToolOutput::error("the body is over 64 KiB: write a shorter one");
            }
            if !self.allowed {
                return ToolOutput::error(
                    "opening a pull request needs the user's approval, and this session was not given it: tell the user, who can open it or run cordon with --allow-push",
                );
            }
            let forge = match &self.forge {
                Ok(f) => f,
                Err(why) => {
                    return ToolOutput::error(format!(
                        "{why}: tell the user the branch is ready for a pull request"
                    ));
                }
            };
            match forge.open(&self.head, &self.base, title, body).await {
                Ok(pr) => ToolOutput::ok(format!(
                    "Opened pull request #{} from {} into {}: {}",
                    pr.number,
                    self.head,
                    self.base,
                    cordon_tools::printable(&pr.html_url)
                ))
                .with_structured(json!({"number": pr.number, "url": pr.html_url})),
                Err(e) => ToolOutput::error(e),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_and_repository_from_urls() {
        for (url, want) in [
            ("https://github.com/o/r.git", Some(("github.com", "o", "r"))),
            ("git@github.com:o/r.git", Some(("github.com", "o", "r"))),
            (
                "https://gitea.example:3000/team/proj",
                Some(("gitea.example:3000", "team", "proj")),
            ),
            ("https://example.com/r", None),
            ("https://github.com/o/../r", None),
        ] {
            let got = owner_repo(url);
            assert_eq!(
                got.as_ref()
                    .map(|(h, o, r)| (h.as_str(), o.as_str(), r.as_str())),
                want,
                "{url}"
            );
        }
    }

    #[test]
    fn the_token_is_not_in_debug_output() {
        let f = Forge::for_repository("https://github.com/o/r", None, None, "ghp_SECRET".into())
            .unwrap();
        assert!(!format!("{f:?}").contains("ghp_SECRET"));
        assert_eq!(f.api, "https://api.github.com");
        let g = Forge::for_repository("https://git.example/o/r", None, None, "t".into()).unwrap();
        assert_eq!(
            (g.kind, g.api.as_str()),
            (ForgeKind::Gitea, "https://git.example/api/v1")
        );
    }
}
