//! Model providers over HTTP: Anthropic Messages and OpenAI Chat
//! Completions, streamed, with retries that never repeat work the agent
//! has acted on (a request is retried only before its answer is complete,
//! and tools run only after that).

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;

use crate::message::{AssistantMessage, StreamDelta};
use crate::stream::{AnthropicStream, OpenAiStream, StreamError};
use crate::wire::{ApiFailure, ModelRequest, anthropic_body, classify, openai_body};

/// Which wire protocol a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Anthropic,
    OpenAi,
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenAi => "openai",
        })
    }
}

/// How to reach a model server.
#[derive(Clone)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// `https://api.anthropic.com` for Anthropic; for OpenAI-compatible
    /// servers the base including `/v1` (e.g. `http://localhost:11434/v1`).
    pub base_url: String,
    pub api_key: Option<String>,
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// First backoff delay; doubles per attempt, with jitter, capped at 30 s.
    pub initial_backoff: Duration,
    /// Longest silence tolerated between two stream events.
    pub idle_timeout: Duration,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("ProviderConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("max_attempts", &self.max_attempts)
            .finish()
    }
}

impl ProviderConfig {
    pub fn new(kind: ProviderKind, base_url: impl Into<String>) -> Self {
        ProviderConfig {
            kind,
            base_url: base_url.into().trim_end_matches('/').to_string(),
            api_key: None,
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// Why a model request failed, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the {provider} API rejected the key ({status}): set a valid {hint}")]
    Auth {
        provider: ProviderKind,
        status: u16,
        hint: &'static str,
    },
    #[error("the model {model:?} is not known to the server: pick another with --model or MODEL")]
    UnknownModel { model: String },
    #[error("the conversation no longer fits the model's context window: {message}")]
    ContextTooLong { message: String },
    #[error("the request was refused ({status}): {message}")]
    Invalid { status: u16, message: String },
    #[error("no complete answer from the model server after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: String },
    #[error("cannot reach the model server at {url}: {message}")]
    Network { url: String, message: String },
    #[error("the model's answer was malformed: {0}")]
    Stream(StreamError),
}

/// How long a server may take to list its models.
const MODELS_TIMEOUT: Duration = Duration::from_secs(10);

/// A configured provider; cheap to clone.
#[derive(Clone, Debug)]
pub struct Provider {
    config: ProviderConfig,
    http: reqwest::Client,
}

/// One reason to try again, and how long to wait first.
struct Retry {
    reason: String,
    after: Option<Duration>,
}

enum Attempt {
    Done(AssistantMessage),
    Retry(Retry),
}

fn error_message(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    v.pointer("/error/message")
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| body.chars().take(300).collect())
}

impl Provider {
    pub fn new(config: ProviderConfig) -> Result<Self, ProviderError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ProviderError::Network {
                url: config.base_url.clone(),
                message: e.to_string(),
            })?;
        Ok(Provider { config, http })
    }

    pub fn kind(&self) -> ProviderKind {
        self.config.kind
    }

    /// The models an OpenAI-compatible server says it serves
    /// (`GET {base}/models`), in its order. `Network` when it cannot be
    /// reached at all; `Invalid` when it answers something else.
    pub async fn models(&self) -> Result<Vec<String>, ProviderError> {
        /// OpenAI's list, of which only the ids are read.
        #[derive(serde::Deserialize)]
        struct List {
            data: Vec<Listed>,
        }
        #[derive(serde::Deserialize)]
        struct Listed {
            id: String,
        }
        let url = format!("{}/models", self.config.base_url);
        let network = |e: reqwest::Error| ProviderError::Network {
            url: url.clone(),
            message: e.to_string(),
        };
        let mut rb = self.http.get(&url).timeout(MODELS_TIMEOUT);
        if let Some(k) = &self.config.api_key {
            rb = rb.bearer_auth(k);
        }
        let r = rb.send().await.map_err(network)?;
        let status = r.status();
        let body = r.text().await.map_err(network)?;
        if !status.is_success() {
            return Err(ProviderError::Invalid {
                status: status.as_u16(),
                message: error_message(&body),
            });
        }
        let list: List = serde_json::from_str(&body).map_err(|e| ProviderError::Invalid {
            status: status.as_u16(),
            message: format!("{url} answered no list of models: {e}"),
        })?;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    fn endpoint(&self) -> String {
        match self.config.kind {
            ProviderKind::Anthropic => format!("{}/v1/messages", self.config.base_url),
            ProviderKind::OpenAi => format!("{}/chat/completions", self.config.base_url),
        }
    }

    /// Sends `req` and streams the answer, calling `on_delta` as it arrives.
    /// Retries on 429, 5xx, 529 and overloaded or broken streams, honouring
    /// `retry-after`; before a retry `on_delta` gets
    /// [`StreamDelta::Retrying`] so a front end can drop the partial answer.
    pub async fn stream(
        &self,
        req: &ModelRequest,
        mut on_delta: impl FnMut(StreamDelta),
    ) -> Result<AssistantMessage, ProviderError> {
        let body = match self.config.kind {
            ProviderKind::Anthropic => anthropic_body(req),
            ProviderKind::OpenAi => openai_body(req),
        };
        let mut backoff = self.config.initial_backoff;
        let attempts = self.config.max_attempts.max(1);
        for attempt in 1..=attempts {
            let retry = match self.attempt(req, &body, &mut on_delta).await? {
                Attempt::Done(msg) => return Ok(msg),
                Attempt::Retry(r) => r,
            };
            if attempt == attempts {
                return Err(ProviderError::Exhausted {
                    attempts,
                    last: retry.reason,
                });
            }
            let wait = retry.after.unwrap_or_else(|| jitter(backoff));
            // Debug, not warn: the caller reports the retry through
            // `on_delta`, and a warning would print it a second time.
            tracing::debug!(
                attempt,
                wait_ms = wait.as_millis() as u64,
                "retrying the model request: {}",
                retry.reason
            );
            on_delta(StreamDelta::Retrying {
                attempt: attempt + 1,
                wait,
                reason: retry.reason,
            });
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
        unreachable!("the loop returns on its last attempt")
    }

    async fn attempt(
        &self,
        req: &ModelRequest,
        body: &serde_json::Value,
        on_delta: &mut impl FnMut(StreamDelta),
    ) -> Result<Attempt, ProviderError> {
        let url = self.endpoint();
        let mut rb = self.http.post(&url).json(body);
        rb = match self.config.kind {
            ProviderKind::Anthropic => {
                let rb = rb.header("anthropic-version", "2023-06-01");
                match &self.config.api_key {
                    Some(k) => rb.header("x-api-key", k),
                    None => rb,
                }
            }
            ProviderKind::OpenAi => match &self.config.api_key {
                Some(k) => rb.bearer_auth(k),
                None => rb,
            },
        };
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Err(ProviderError::Network {
                    url,
                    message: root_cause(&e),
                });
            }
            Err(e) => {
                return Ok(Attempt::Retry(Retry {
                    reason: format!("request failed: {e}"),
                    after: None,
                }));
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Duration::from_secs_f64(s.min(300.0)));
            let text = resp.text().await.unwrap_or_default();
            let message = error_message(&text);
            return match classify(status, &text) {
                ApiFailure::Retryable => Ok(Attempt::Retry(Retry {
                    reason: format!("HTTP {status}: {message}"),
                    after,
                })),
                ApiFailure::Auth => Err(ProviderError::Auth {
                    provider: self.config.kind,
                    status,
                    hint: match self.config.kind {
                        ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
                        ProviderKind::OpenAi => "OPENAI_API_KEY",
                    },
                }),
                ApiFailure::UnknownModel => Err(ProviderError::UnknownModel {
                    model: req.model.clone(),
                }),
                ApiFailure::ContextTooLong => Err(ProviderError::ContextTooLong { message }),
                ApiFailure::Invalid => Err(ProviderError::Invalid { status, message }),
            };
        }
        let mut events = resp.bytes_stream().eventsource();
        let mut anthropic = AnthropicStream::new();
        let mut openai = OpenAiStream::new();
        loop {
            let next = match tokio::time::timeout(self.config.idle_timeout, events.next()).await {
                Ok(n) => n,
                Err(_) => {
                    return Ok(Attempt::Retry(Retry {
                        reason: format!("no data for {:?}", self.config.idle_timeout),
                        after: None,
                    }));
                }
            };
            let event = match next {
                None => break,
                Some(Ok(ev)) => ev,
                Some(Err(e)) => {
                    return Ok(Attempt::Retry(Retry {
                        reason: format!("the stream broke: {e}"),
                        after: None,
                    }));
                }
            };
            let fed = match self.config.kind {
                ProviderKind::Anthropic => anthropic.feed(&event.data),
                ProviderKind::OpenAi => openai.feed(&event.data),
            };
            match fed {
                Ok(deltas) => deltas.into_iter().for_each(&mut *on_delta),
                Err(e) if e.is_retryable() => {
                    return Ok(Attempt::Retry(Retry {
                        reason: e.to_string(),
                        after: None,
                    }));
                }
                Err(e) => return Err(ProviderError::Stream(e)),
            }
            let done = match self.config.kind {
                ProviderKind::Anthropic => anthropic.is_done(),
                ProviderKind::OpenAi => openai.is_done(),
            };
            if done {
                break;
            }
        }
        let finished = match self.config.kind {
            ProviderKind::Anthropic => anthropic.finish(),
            ProviderKind::OpenAi => openai.finish(),
        };
        match finished {
            Ok(msg) => Ok(Attempt::Done(msg)),
            Err(e) if e.is_retryable() => Ok(Attempt::Retry(Retry {
                reason: e.to_string(),
                after: None,
            })),
            Err(e) => Err(ProviderError::Stream(e)),
        }
    }
}

/// The innermost error's message: reqwest's own only repeats the URL, the
/// reason (connection refused, no such host) is at the bottom of the chain.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// `base` scaled by a random factor in [0.5, 1.5), so clients that failed
/// together do not retry together.
fn jitter(base: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // A cheap mix of the clock: jitter needs spread, not secrecy.
    let x = (nanos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    let factor = 0.5 + (x as f64 / (1u64 << 24) as f64);
    base.mul_f64(factor)
}
