//! What the sessions API takes and answers.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::Timestamp;
use crate::job::{AllowEntry, NetworkMode, Screen, Text};
use crate::store::SessionRow;

/// A new conversation; every field may be left out.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// The model (default: the server's).
    #[serde(default)]
    pub model: Option<Text>,
    /// A virtual screen: the agent then has the computer tool, and
    /// `/v1/sessions/{id}/vnc` shows the desktop.
    #[serde(default)]
    pub display: Option<Screen>,
    /// As a job's: `off` (the default; `allow` when `allow` is given),
    /// `loopback` or `allow`.
    #[serde(default)]
    pub network: Option<NetworkMode>,
    /// As a job's: the hosts, within this tenant's ceiling.
    #[serde(default)]
    #[schema(max_items = 256)]
    pub allow: Option<Vec<AllowEntry>>,
    #[serde(default)]
    pub allow_private: Option<bool>,
    /// As a job's: a repository cloned into the workspace, on a branch
    /// `cordon/<session id>`, with the tenant's stored login.
    #[serde(default)]
    pub repo: Option<crate::job::RepoUrl>,
    /// With `repo`: the model may push the session's branch and open a
    /// pull request.
    #[serde(default)]
    pub allow_push: Option<bool>,
    /// As a job's: the image the sandbox's root is made from, by a name
    /// this tenant is offered (`GET /v1/images`); obtained when the
    /// session is created, kept for its life.
    #[serde(default)]
    pub image: Option<crate::job::ImageName>,
}

/// A message to the agent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMessage {
    #[schema(example = "Add a test for the parser and run it")]
    pub text: Text,
    /// Images the model sees with the text (at most 8; the request's size
    /// limit bounds their bytes).
    #[serde(default)]
    #[schema(max_items = 8)]
    pub images: Vec<ImagePart>,
}

/// Most images one message may carry.
pub const MAX_IMAGES: usize = 8;

/// An image in a message: its type and its bytes in base64, which must be
/// an image of that type.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, try_from = "RawImagePart")]
pub struct ImagePart {
    pub media_type: ImageType,
    /// Standard base64, no line breaks.
    pub data: String,
}

/// The image types the models take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, ToSchema)]
pub enum ImageType {
    #[serde(rename = "image/png")]
    Png,
    #[serde(rename = "image/jpeg")]
    Jpeg,
    #[serde(rename = "image/gif")]
    Gif,
    #[serde(rename = "image/webp")]
    Webp,
}

impl ImageType {
    fn as_str(self) -> &'static str {
        match self {
            ImageType::Png => "image/png",
            ImageType::Jpeg => "image/jpeg",
            ImageType::Gif => "image/gif",
            ImageType::Webp => "image/webp",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImagePart {
    media_type: ImageType,
    data: String,
}

impl TryFrom<RawImagePart> for ImagePart {
    type Error = String;
    fn try_from(raw: RawImagePart) -> Result<ImagePart, String> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(raw.data.as_bytes())
            .map_err(|e| format!("an image's data is not base64: {e}"))?;
        match cordon_tools::attach::media_type(&bytes) {
            Some(t) if t == raw.media_type.as_str() => Ok(ImagePart {
                media_type: raw.media_type,
                data: raw.data,
            }),
            Some(t) => Err(format!(
                "an image says it is {} but its bytes are {t}",
                raw.media_type.as_str()
            )),
            None => Err(format!(
                "an image's bytes are not {}",
                raw.media_type.as_str()
            )),
        }
    }
}

impl From<ImagePart> for cordon_tools::Image {
    fn from(p: ImagePart) -> cordon_tools::Image {
        cordon_tools::Image {
            media_type: p.media_type.as_str().to_string(),
            data: p.data,
        }
    }
}

/// Where to take a session back to.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindTo {
    /// The turn whose end the files and the conversation go back to; 0 is
    /// before the first message. Turns are the conversation's as it is
    /// now, after any rewind.
    #[serde(default)]
    pub turn: Option<u64>,
    /// Instead of a turn: take back the last rewind (the files and the
    /// conversation as they were just before it; again, redo it).
    #[serde(default)]
    pub undo: bool,
}

/// A path a rewind left as it was, and why.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeptPath {
    pub path: String,
    pub why: String,
}

/// What a rewind did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Rewound {
    /// The turn the session is now at the end of.
    pub turn: u64,
    pub written: u64,
    pub removed: u64,
    /// Files left as they were: ignored, too large to keep, or new since.
    pub kept: Vec<KeptPath>,
    /// The checkpoint restored.
    pub checkpoint: String,
    /// The checkpoint of the files as they were just before.
    pub before: String,
}

/// A conversation, as listed.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionSummary {
    #[schema(example = "ses_0f9c2a4d783dc2aec74a934e")]
    pub id: String,
    /// The first line of the first message.
    pub title: String,
    pub model: String,
    pub created_at: Timestamp,
}

impl SessionSummary {
    pub fn of(row: &SessionRow) -> SessionSummary {
        SessionSummary {
            id: row.id.clone(),
            title: row.title.clone(),
            model: row.model.clone(),
            created_at: Timestamp::at(row.created_ms),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionSummary>,
}

/// A conversation with its messages as last sent to the model.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    #[serde(flatten)]
    pub summary: SessionSummary,
    pub turns: u64,
    /// Tokens: `input_tokens`, `output_tokens`, `cache_read_tokens`,
    /// `cache_write_tokens`.
    #[schema(value_type = Object)]
    pub usage: cordon_agent::Usage,
    /// In the Anthropic Messages shape.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<cordon_agent::Message>,
    /// What each tool call in `messages` does, by its id: the line it was
    /// shown with (the command, the path, …). Calls from before labels
    /// were have none.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The session's virtual screen, if it was created with one.
    pub display: Option<Screen>,
    pub network: NetworkMode,
    /// The rules its broker applies now (presets expanded).
    pub allow: Vec<String>,
    /// `true` while its desktop is up (the session is awake).
    pub live_desktop: bool,
}

/// What cancelling did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Cancelled {
    pub cancelled: bool,
}

/// What compaction did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Compaction {
    pub replaced_messages: u64,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub summary: String,
}
