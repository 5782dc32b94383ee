//! A job's or session's `image`, as a request names it. Which names a
//! tenant may use, and where each comes from, is the `catalog` module's.

use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// Bytes of an image's name at most (a registry reference with a digest
/// is about 150).
pub const MAX_IMAGE_NAME: usize = 255;

/// An image's name as a tenant gives it: printable, without spaces, at
/// most [`MAX_IMAGE_NAME`] bytes. Only its form is checked here; whether
/// the tenant may use it is the server's catalog's to say.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ImageName(String);

impl TryFrom<String> for ImageName {
    type Error = String;
    fn try_from(s: String) -> Result<ImageName, String> {
        if s.is_empty() {
            return Err("`image` is empty: name an image (GET /v1/images lists them)".into());
        }
        if s.len() > MAX_IMAGE_NAME {
            return Err(format!(
                "`image` has {} bytes; at most {MAX_IMAGE_NAME}",
                s.len()
            ));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "`image` {} has a space or a character no image name has",
                cordon_tools::printable(&s)
            ));
        }
        Ok(ImageName(s))
    }
}

impl From<ImageName> for String {
    fn from(n: ImageName) -> String {
        n.0
    }
}

impl ImageName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ImageName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialSchema for ImageName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(MAX_IMAGE_NAME))
            .description(Some(
                "The image the sandbox's root is made from, by a name the server offers this \
                 tenant (`GET /v1/images`): a name of the operator's catalog, or a registry \
                 reference under a repository the operator opened, pulled on first use. \
                 Default: the server's default image, or else the host's own root. The \
                 image's `Env` and `User` apply; commands run in /workspace.",
            ))
            .examples([serde_json::Value::String("debian:bookworm".into())])
            .into()
    }
}
impl ToSchema for ImageName {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_printable_words() {
        for ok in [
            "seeds",
            "debian:bookworm",
            "127.0.0.1:5000/team/app@sha256:00",
        ] {
            assert_eq!(
                String::from(ImageName::try_from(ok.to_string()).unwrap()),
                ok
            );
        }
        for bad in ["", "a b", "x\u{1b}[2J", "\u{e9}", &"a".repeat(256)] {
            assert!(ImageName::try_from(bad.to_string()).is_err(), "{bad:?}");
        }
    }
}
