//! A session's network policy: what it was created with, changed through
//! the API while it is live (the broker takes it at once, its agent logs
//! it) or idle (a record in its log, which the next sandbox starts from).

use super::*;

/// A session's network from its log: the mode and hosts it was created
/// with, as the last `network_policy` record left them.
pub(super) fn logged_network<'a>(
    records: impl Iterator<Item = &'a Value>,
) -> (cordon_sandbox::Network, Option<cordon_net::Policy>) {
    let mut network = cordon_sandbox::Network::Off;
    let mut policy = None;
    for r in records {
        match r["type"].as_str() {
            Some("session_started") => {
                let Some(s) = SessionStarted::from_record(r) else {
                    continue;
                };
                network = s.network.unwrap_or_default();
                if network == cordon_sandbox::Network::Allow {
                    policy = cordon_net::Policy::parse(
                        &s.allow.unwrap_or_default(),
                        s.allow_private.unwrap_or(false),
                    )
                    .ok();
                }
            }
            Some("network_policy") if network == cordon_sandbox::Network::Allow => {
                if let Ok(rec) = serde_json::from_value::<cordon_agent::PolicyRecord>(r.clone())
                    && let Ok(p) = cordon_net::Policy::parse(&rec.allow, rec.allow_private)
                {
                    policy = Some(p);
                }
            }
            _ => {}
        }
    }
    (network, policy)
}

fn read_log(shared: &Shared, id: &str) -> Result<Vec<Value>, ApiError> {
    let path = dir(shared, id).join("session.jsonl");
    Ok(load_log(&path, id)?.into_iter().map(|r| r.data).collect())
}

#[utoipa::path(get, path = "/v1/sessions/{id}/network", tag = "sessions", summary = "A session's network policy",
    description = "What the session's sandbox may reach through cordon's broker: while it is live, the policy applied now; otherwise the one its next message starts with.",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::network::NetworkView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<crate::network::NetworkView>, ApiError> {
    find(&shared, &tenant, &id).await?;
    let records = read_log(&shared, &id)?;
    let (network, logged) = logged_network(records.iter());
    let live = shared.policies.get(&crate::network::session_key(&id));
    let policy = live.as_ref().map(|h| (*h.load()).clone()).or(logged);
    Ok(Json(crate::network::NetworkView::new(
        network,
        policy.as_ref(),
        live.is_some(),
        &shared.ceilings.of(&tenant),
    )))
}

#[utoipa::path(put, path = "/v1/sessions/{id}/network", tag = "sessions", summary = "Change a session's network policy",
    description = "Replaces what a session created with `network` \"allow\" may reach, within this tenant's ceiling: at once if it is live (even mid-turn), else from its next message. Recorded in the session's log as a `network_policy` record.",
    params(("id" = String, Path)),
    request_body(content = crate::network::PolicyChange, examples(
        ("nothing" = (summary = "Reach nothing from now on", value = json!({"allow": []}))),
        ("a host" = (summary = "One host, HTTPS only", value = json!({"allow": ["api.example.com:443"]}))))),
    responses((status = 200, body = crate::network::NetworkView), (status = 400, description = "The body says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Beyond this tenant's ceiling", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "Its network is not brokered, or it is waking", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::network::NetworkView>, ApiError> {
    let row = find(&shared, &tenant, &id).await?;
    let change =
        crate::network::parse_change(&crate::http::within(body, shared.config.body_limit)?)?;
    let records = read_log(&shared, &id)?;
    let (network, logged) = logged_network(records.iter());
    if network != cordon_sandbox::Network::Allow {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_brokered",
            format!(
                "session {id}'s network is {network:?}, not brokered: create a session with `network` \"allow\" to change what it reaches"
            ),
        ));
    }
    let policy = shared
        .ceilings
        .settle(&row.tenant, &change, crate::network::Empty::Nothing)?;
    let key = crate::network::session_key(&id);
    let view = |live: bool| {
        Json(crate::network::NetworkView::new(
            network,
            Some(&policy),
            live,
            &shared.ceilings.of(&tenant),
        ))
    };
    // Live: the broker takes it at once and the session's agent records it.
    // Held, it cannot be reaped meanwhile; busy, a turn is running (or the
    // session is waking, and not listed yet).
    let slot = shared.sessions.slot(&id);
    let guard = match slot.try_lock_owned() {
        Ok(mut guard) => {
            if let Some(live) = guard.as_mut() {
                live.last_used = Instant::now();
            }
            Some(guard)
        }
        Err(_) => None,
    };
    if let Some(handle) = shared.policies.get(&key) {
        handle.set(policy.clone());
        return Ok(view(true));
    }
    if guard.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "busy",
            "the session is waking; try again in a moment",
        ));
    }
    // Idle: nothing else writes its log while the slot is held.
    let before = logged.unwrap_or_default();
    let record = cordon_agent::PolicyRecord::between(&before, &policy);
    let path = dir(&shared, &id).join("session.jsonl");
    let appended = SessionLog::<Value>::open(&path).and_then(|(mut log, _, _)| {
        log.append(&serde_json::to_value(&record).unwrap_or_default())?;
        log.sync()
    });
    appended.map_err(|e| {
        tracing::error!("session {id}: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot record the change in the session's log",
        )
    })?;
    Ok(view(false))
}
