//! MCP sessions over HTTP that belong to whoever opened them.
//!
//! rmcp knows a session only by its id, so anyone holding the id can post
//! to it, cancel its calls, open its event stream or delete it. Here each
//! session is recorded with its owner (and whatever the server wants held
//! for as long as it lives, such as a slot under a cap) when it is
//! initialised, and forgotten when rmcp closes it (a DELETE, an idle
//! worker, a failed handshake). The server checks every request's
//! `Mcp-Session-Id` against [`SessionOwners`] before rmcp sees it.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, GetExtensions, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

/// Who an HTTP request is from: put in the request's extensions by the
/// server's authentication, before rmcp sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpTenant(pub String);

/// Something kept alive for as long as the session it came with: put in
/// the initializing request's extensions (next to its [`McpTenant`]) and
/// dropped when the session ends.
#[derive(Clone)]
pub struct SessionHold(#[allow(dead_code)] Arc<dyn Any + Send + Sync>);

impl SessionHold {
    pub fn new(held: impl Any + Send + Sync) -> Self {
        SessionHold(Arc::new(held))
    }
}

struct Owner {
    tenant: Option<McpTenant>,
    _hold: Option<SessionHold>,
}

/// The live sessions and who opened each.
#[derive(Default)]
pub struct SessionOwners {
    owners: Mutex<HashMap<SessionId, Owner>>,
}

impl SessionOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Owner>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `id` is a live session that someone other than `caller`
    /// opened. An unknown id is nobody's: rmcp answers it as it would.
    pub fn belongs_to_another(&self, id: &str, caller: Option<&McpTenant>) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|o| o.tenant.as_ref() != caller)
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A session manager that records each session's owner in a
/// [`SessionOwners`] from its first request, and forgets it when the
/// session is closed.
pub struct OwnedSessions<M> {
    inner: M,
    owners: Arc<SessionOwners>,
}

impl<M> OwnedSessions<M> {
    pub fn new(inner: M, owners: Arc<SessionOwners>) -> Self {
        OwnedSessions { inner, owners }
    }

    /// Who opened each live session.
    pub fn owners(&self) -> &SessionOwners {
        &self.owners
    }
}

impl<M: SessionManager> OwnedSessions<M> {
    /// Ends every live session `tenant` opened, as its DELETE would (its
    /// sandbox and workspace with it); how many it ended.
    pub async fn close_tenant(&self, tenant: &McpTenant) -> usize {
        let ids: Vec<SessionId> = self
            .owners
            .lock()
            .iter()
            .filter(|(_, o)| o.tenant.as_ref() == Some(tenant))
            .map(|(id, _)| id.clone())
            .collect();
        let mut closed = 0;
        for id in ids {
            match self.close_session(&id).await {
                Ok(()) => closed += 1,
                Err(e) => tracing::warn!("MCP session {id}: cannot end it: {e}"),
            }
        }
        closed
    }
}

impl<M: SessionManager> SessionManager for OwnedSessions<M> {
    type Error = M::Error;
    type Transport = M::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        // Recorded before the handshake, so before the id is ever sent to
        // the client: there is no moment when the session is unowned.
        let parts = match &message {
            ClientJsonRpcMessage::Request(r) => {
                r.request.extensions().get::<http::request::Parts>()
            }
            _ => None,
        };
        let owner = Owner {
            tenant: parts.and_then(|p| p.extensions.get::<McpTenant>()).cloned(),
            _hold: parts
                .and_then(|p| p.extensions.get::<SessionHold>())
                .cloned(),
        };
        self.owners.lock().insert(id.clone(), owner);
        let result = self.inner.initialize_session(id, message).await;
        if result.is_err() {
            let _ = self.close_session(id).await;
        }
        result
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // Closed first, forgotten after: never reachable while unowned.
        let closed = self.inner.close_session(id).await;
        self.owners.lock().remove(id);
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        _id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // A restored session would have no owner: none are restored.
        Ok(RestoreOutcome::NotSupported)
    }

    fn event_store(
        &self,
    ) -> Option<Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.inner.event_store()
    }
}
