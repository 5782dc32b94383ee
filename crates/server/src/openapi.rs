//! The OpenAPI document (`/openapi.json`; docs.rs renders it at `/docs`).
//! Every schema in it is derived from the type the handlers read or write;
//! nothing here describes the wire a second time.

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::state::Shared;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The examples of `POST /v1/jobs`: one per kind, from the kind itself,
/// and one with a network.
struct JobExamples;

impl Modify for JobExamples {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::RefOr;
        use utoipa::openapi::example::ExampleBuilder;
        let Some(content) = api
            .paths
            .paths
            .get_mut("/v1/jobs")
            .and_then(|p| p.post.as_mut())
            .and_then(|op| op.request_body.as_mut())
            .and_then(|body| body.content.get_mut("application/json"))
        else {
            return;
        };
        let network = (
            "A job that may reach the Python registry",
            json!({"kind": "shell", "command": "pip download --no-deps requests -d /tmp/dl", "allow": ["@python"]}),
        );
        let kinds = crate::job::JobKind::all().map(|k| (k.as_str(), k.example()));
        for (name, (summary, value)) in kinds.chain([("network", network)]) {
            let example = ExampleBuilder::new().summary(summary).value(Some(value));
            content
                .examples
                .insert(name.to_string(), RefOr::T(example.build()));
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "cordon",
        description = "Jobs, agent sessions and sandboxes in cordon's sandbox. Every route but /health needs `Authorization: Bearer <token>` (`cordon token create --tenant NAME`)."
    ),
    modifiers(&Bearer, &JobExamples),
    components(schemas(crate::job::JobEvent), responses(crate::files::FileAnswer)),
    security(("bearer" = [])),
    paths(
        crate::health::health,
        crate::jobs::create_job,
        crate::jobs::list_jobs,
        crate::jobs::get_job,
        crate::jobs::cancel_job,
        crate::jobs::delete_job,
        crate::jobs::job_events,
        crate::owned::get_job_network,
        crate::owned::put_job_network,
        crate::owned::job_vnc,
        crate::owned::open_job_lab,
        crate::owned::job_lab,
        crate::owned::job_ports,
        crate::owned::job_preview,
        crate::owned::list_job_root,
        crate::owned::get_job_file,
        crate::owned::put_job_file,
        crate::jobs::schedule,
        crate::jobs::status,
        crate::jobs::status_by_query,
        crate::sessions::create,
        crate::sessions::list,
        crate::sessions::show,
        crate::sessions::delete,
        crate::sessions::message,
        crate::sessions::cancel,
        crate::sessions::pause,
        crate::sessions::resume,
        crate::sessions::compact,
        crate::sessions::rewind,
        crate::owned::session_vnc,
        crate::owned::open_session_lab,
        crate::owned::session_lab,
        crate::owned::session_ports,
        crate::owned::session_preview,
        crate::owned::get_session_network,
        crate::owned::list_session_root,
        crate::owned::get_session_file,
        crate::owned::put_session_file,
        crate::owned::put_session_network,
        crate::sandbox_api::create_sandbox,
        crate::sandbox_api::list_sandboxes,
        crate::sandbox_api::get_sandbox,
        crate::sandbox_api::delete_sandbox,
        crate::sandbox_api::set_sandbox_timeout,
        crate::sandbox_api::pause_sandbox,
        crate::sandbox_api::resume_sandbox,
        crate::sandbox_api::fork_sandbox,
        crate::sandbox_api::sandbox_metrics,
        crate::sandbox_api::fs_stat,
        crate::sandbox_api::fs_list,
        crate::sandbox_api::fs_mkdir,
        crate::sandbox_api::fs_move,
        crate::sandbox_api::fs_remove,
        crate::sandbox_api::fs_watch,
        crate::sandbox_api::fs_archive_get,
        crate::sandbox_api::fs_archive_put,
        crate::sandbox_api::run_command,
        crate::sandbox_api::list_processes,
        crate::sandbox_api::follow_process,
        crate::sandbox_api::write_stdin,
        crate::sandbox_api::signal_process,
        crate::sandbox_api::open_pty,
        crate::owned::list_sandbox_root,
        crate::owned::get_sandbox_file,
        crate::owned::put_sandbox_file,
        crate::owned::get_sandbox_network,
        crate::owned::put_sandbox_network,
        crate::owned::sandbox_ports,
        crate::owned::sandbox_preview,
        crate::tokens::list_tokens,
        crate::tokens::create_token,
        crate::tokens::revoke_token,
        crate::credentials::list_credentials,
        crate::credentials::put_credential,
        crate::credentials::delete_credential,
        crate::tenants::forget_tenant,
        crate::images::list_images,
        crate::images::create_image,
        crate::images::delete_image,
        crate::images::snapshot_session,
    ),
    tags(
        (name = "jobs", description = "Queued, sandboxed jobs"),
        (name = "server", description = "The server itself"),
        (name = "sessions", description = "Conversations with the agent"),
        (name = "sandboxes", description = "Sandboxes driven from code: commands, files, network and ports"),
        (name = "tokens", description = "Bearer tokens and tenants, for an operator's token only"),
        (name = "images", description = "The images jobs and sessions may run in: the operator's catalog and the tenant's own (pulled, built, snapshotted)"),
        (name = "git", description = "The tenant's logins for git hosts, used by workers for jobs with `repo`"),
        (name = "compatibility", description = "`/schedule` and `/status`: the job routes of cordon's first API, kept for the clients written against it; `/v1/jobs` does all they do"),
    )
)]
pub struct ApiDoc;

/// Links from an operation's answer to the operations that take the id it
/// returns: how a client (or a fuzzer) follows a job from creation on.
fn add_links(doc: &mut Value) {
    let links = |ops: &[(&str, &str, &str)]| -> Value {
        ops.iter()
            .map(|(op, param, from)| {
                (
                    op.to_string(),
                    json!({"operationId": op, "parameters": {*param: from}}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let job = "$response.body#/id";
    let job_links = links(&[
        ("get_job", "id", job),
        ("cancel_job", "id", job),
        ("job_events", "id", job),
        ("list_job_root", "id", job),
        ("get_job_file", "id", job),
        ("put_job_file", "id", job),
        ("job_ports", "id", job),
        ("job_preview", "id", job),
        ("status", "id", job),
        ("status_by_query", "task_id", job),
    ]);
    let scheduled = links(&[
        ("status", "id", "$response.body#/job_id"),
        ("get_job", "id", "$response.body#/job_id"),
    ]);
    let session = "$response.body#/id";
    let session_links = links(&[
        ("show", "id", session),
        ("message", "id", session),
        ("cancel", "id", session),
        ("compact", "id", session),
        ("rewind", "id", session),
        ("list_session_root", "id", session),
        ("get_session_file", "id", session),
        ("put_session_file", "id", session),
        ("session_ports", "id", session),
        ("session_preview", "id", session),
    ]);
    let sandbox = "$response.body#/id";
    let sandbox_links = links(&[
        ("get_sandbox", "id", sandbox),
        ("delete_sandbox", "id", sandbox),
        ("set_sandbox_timeout", "id", sandbox),
        ("sandbox_metrics", "id", sandbox),
        ("fs_list", "id", sandbox),
        ("run_command", "id", sandbox),
        ("list_processes", "id", sandbox),
        ("list_sandbox_root", "id", sandbox),
        ("get_sandbox_file", "id", sandbox),
        ("put_sandbox_file", "id", sandbox),
        ("get_sandbox_network", "id", sandbox),
        ("sandbox_ports", "id", sandbox),
        ("sandbox_preview", "id", sandbox),
    ]);
    for (path, method, status, l) in [
        ("/v1/jobs", "post", "202", job_links),
        ("/schedule", "post", "202", scheduled),
        ("/v1/sessions", "post", "201", session_links),
        ("/v1/sandboxes", "post", "201", sandbox_links),
    ] {
        if let Some(r) = doc
            .pointer_mut(&format!(
                "/paths/{}/{method}/responses/{status}",
                path.replace('/', "~1")
            ))
            .and_then(Value::as_object_mut)
        {
            r.insert("links".into(), l);
        }
    }
}

/// utoipa writes a variant of an internally tagged enum as `allOf` of the
/// variant's struct and an object with the tag. When the struct refuses
/// unknown fields (`additionalProperties: false`), that `allOf` admits no
/// value at all: the struct's half refuses the tag. One closed object with
/// the tag among its properties says what serde accepts.
fn close_tagged_variants(doc: &mut Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let named = schemas.clone();
    let resolve = |v: &Value| -> Value {
        v.get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .and_then(|n| named.get(n))
            .unwrap_or(v)
            .clone()
    };
    for schema in schemas.values_mut() {
        let Some(variants) = schema.get_mut("oneOf").and_then(Value::as_array_mut) else {
            continue;
        };
        for variant in variants.iter_mut() {
            let Some([body, tag]) = variant
                .get("allOf")
                .and_then(Value::as_array)
                .and_then(|a| <&[Value; 2]>::try_from(a.as_slice()).ok())
            else {
                continue;
            };
            let (Some(tag_props), Some(tag_required)) = (
                tag.get("properties").and_then(Value::as_object),
                tag.get("required").and_then(Value::as_array),
            ) else {
                continue;
            };
            let mut merged = resolve(body);
            if merged.get("additionalProperties") != Some(&Value::Bool(false)) {
                continue;
            }
            let (tag_props, tag_required) = (tag_props.clone(), tag_required.clone());
            if let Some(props) = merged.get_mut("properties").and_then(Value::as_object_mut) {
                // The tag first, as a reader looks for it first.
                let rest = std::mem::take(props);
                props.extend(tag_props);
                props.extend(rest);
            }
            let required = merged
                .as_object_mut()
                .map(|m| m.entry("required").or_insert_with(|| json!([])));
            if let Some(Value::Array(r)) = required {
                let rest = std::mem::take(r);
                r.extend(tag_required);
                r.extend(rest);
            }
            *variant = merged;
        }
    }
}

/// The document served at /openapi.json.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    close_tagged_variants(&mut doc);
    add_links(&mut doc);
    doc
}

pub fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/openapi.json", get(|| async { Json(document()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples /docs offers are jobs this server takes, one per kind.
    #[test]
    fn every_job_example_is_a_valid_job() {
        let doc = document();
        let examples = doc
            .pointer("/paths/~1v1~1jobs/post/requestBody/content/application~1json/examples")
            .and_then(Value::as_object)
            .expect("POST /v1/jobs has examples");
        let mut kinds = std::collections::HashSet::new();
        for (name, example) in examples {
            let req = crate::job::JobRequest::from_json(example["value"].clone())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            req.check(&crate::job::Bounds::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            kinds.insert(req.kind());
        }
        assert_eq!(kinds.len(), crate::job::JobKind::all().count(), "{kinds:?}");

        // The web page builds its form from these: the kinds from
        // `JobKind`'s enum, each prefilled from the example of its name.
        let listed = doc.pointer("/components/schemas/JobKind/enum");
        let all: Vec<&str> = crate::job::JobKind::all().map(|k| k.as_str()).collect();
        assert_eq!(listed, Some(&json!(all)));
        for kind in all {
            assert_eq!(examples[kind]["value"]["kind"], kind, "{kind}");
        }
    }

    /// Every link names an operation of the document, whose path takes the
    /// parameter the link fills: a renamed handler breaks no client's walk.
    #[test]
    fn every_link_leads_to_an_operation() {
        let doc = document();
        let mut ops = std::collections::HashMap::new();
        for (path, methods) in doc["paths"].as_object().unwrap() {
            for op in methods.as_object().unwrap().values() {
                if let Some(id) = op["operationId"].as_str() {
                    ops.insert(id.to_string(), path.clone());
                }
            }
        }
        let mut seen = 0;
        for methods in doc["paths"].as_object().unwrap().values() {
            for op in methods.as_object().unwrap().values() {
                for answer in op["responses"].as_object().into_iter().flatten() {
                    for link in answer.1["links"].as_object().into_iter().flatten() {
                        let id = link.1["operationId"].as_str().unwrap();
                        let path = ops.get(id).unwrap_or_else(|| panic!("no operation {id}"));
                        for param in link.1["parameters"].as_object().unwrap().keys() {
                            let query = param == "task_id";
                            assert!(query || path.contains(&format!("{{{param}}}")), "{id}");
                        }
                        seen += 1;
                    }
                }
            }
        }
        assert!(seen >= 20, "{seen}");
    }

    /// Each job kind and each step is one closed object whose tag is a
    /// required property: what serde accepts, no more.
    #[test]
    fn tagged_unions_are_closed_objects_with_their_tag() {
        let doc = document();
        if let Ok(p) = std::env::var("CORDON_DUMP_OPENAPI") {
            std::fs::write(p, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
        }
        let kinds = crate::job::JobKind::all().count();
        for (name, tag, count) in [("JobRequest", "kind", kinds), ("Step", "tool", 7)] {
            let variants = doc["components"]["schemas"][name]["oneOf"]
                .as_array()
                .unwrap_or_else(|| panic!("{name} is a oneOf"));
            assert_eq!(variants.len(), count, "{name}");
            for v in variants {
                assert_eq!(v["type"], "object", "{name}: {v}");
                assert!(v["properties"][tag]["enum"].is_array(), "{name}: {v}");
                assert!(
                    v["required"].as_array().unwrap().contains(&json!(tag)),
                    "{name}: {v}"
                );
                assert_eq!(v["additionalProperties"], false, "{name}: {v}");
            }
        }
        let names: Vec<&String> = doc["components"]["schemas"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert!(
            names.iter().all(|n| !n.ends_with("Doc")),
            "mirror types are gone: {names:?}"
        );
    }
}
