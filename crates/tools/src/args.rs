//! Turning the model's JSON arguments into typed input, with errors that
//! tell the model what to fix instead of panicking.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{ToolContext, ToolFuture, ToolOutput};

/// Parses `input` as `T`. On failure the error output names the tool, says
/// what was wrong (serde's message names the field and the expected type)
/// and repeats the schema so the model can retry with valid arguments.
pub fn parse<T: DeserializeOwned>(
    tool: &str,
    schema: &Value,
    input: Value,
) -> Result<T, ToolOutput> {
    // Some models send `null` or nothing for a tool without required
    // arguments; treat that as an empty object.
    let input = if input.is_null() {
        Value::Object(Default::default())
    } else {
        input
    };
    if !input.is_object() {
        return Err(invalid(tool, schema, "the arguments must be a JSON object"));
    }
    serde_json::from_value(input).map_err(|e| invalid(tool, schema, &e.to_string()))
}

/// The error output for arguments `tool` cannot take, and why: with the
/// schema to call it again with.
pub fn invalid(tool: &str, schema: &Value, why: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "Invalid arguments for `{tool}`: {why}. Call it again with arguments matching this schema: {schema}"
    ))
}

/// Runs `work` on a blocking thread, as `tool`'s call: the file tools do
/// synchronous I/O that must not stall the async runtime.
pub fn blocking<'a, T, F>(
    tool: &'static str,
    ctx: &ToolContext,
    input: T,
    work: F,
) -> ToolFuture<'a>
where
    T: Send + 'static,
    F: FnOnce(&ToolContext, T) -> ToolOutput + Send + 'static,
{
    let ctx = ctx.clone();
    Box::pin(async move {
        tokio::task::spawn_blocking(move || work(&ctx, input))
            .await
            .unwrap_or_else(|e| ToolOutput::error(format!("{tool} failed: {e}")))
    })
}
