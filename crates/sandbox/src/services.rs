//! Per-sandbox host-side services: work cordon does on the host for one
//! sandbox, for as long as that sandbox lives, which the sandbox reaches
//! only through a channel its backend gives it. The one service so far is
//! the egress broker ([`crate::Network::Allow`]).
//!
//! A backend starts them in its `create`, before it launches the sandbox
//! (the channels are part of the launch), and hands them to the session in
//! `session::ConnectParams`, which calls [`Services::ready`] once
//! the supervisor is ready and holds them until it ends.
//!
//! Natively the channel is a `SOCK_SEQPACKET` pair: the supervisor gets one
//! end as [`crate::layout::SERVICES_FD`], makes the broker's listening
//! socket on the sandbox's loopback, and sends it back with `SCM_RIGHTS`
//! before it reports ready. The host then accepts on that socket itself, so
//! no byte of the sandbox's traffic passes through the supervisor, and the
//! sandbox has nothing it could use to reach the host's network.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use std::sync::Arc;

use cordon_net::{Broker, PolicyHandle, PresetEnv};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketFlags, SocketType,
};
use tokio::sync::broadcast;

use crate::config::{Network, SandboxConfig};
use crate::egress::{NetworkInfo, PROXY_PORT, Tee};
use crate::error::{Error, Result};
use crate::netrelay::NetRelay;

/// Connection events a subscriber may fall behind by before it loses the
/// oldest.
const EVENT_BACKLOG: usize = 1024;

/// How the sandbox reaches its services: natively the supervisor hands the
/// broker its listening socket; a microVM guest relays each connection
/// over the control channel ([`NetRelay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    Socket,
    Relay,
}

/// Connections the host may have open into one sandbox at once through
/// its forwarded ports (the guest's own side allows 256 in all).
const MAX_DIALS: usize = 128;

/// The host-side services of one sandbox.
pub(crate) struct Services {
    egress: Option<EgressService>,
    /// Connections over the control channel: the host's dials into the
    /// sandbox, and a microVM guest's proxy connections.
    relay: Arc<NetRelay>,
}

struct EgressService {
    broker: Broker,
    info: NetworkInfo,
    /// The host's end of the channel the listener comes back on, until it
    /// has.
    host_end: Mutex<Option<OwnedFd>>,
    /// The end the supervisor is launched with; the host's copy is closed
    /// once the supervisor holds it ([`Services::launched`]).
    sandbox_end: Mutex<Option<OwnedFd>>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("egress", &self.egress.is_some())
            .finish()
    }
}

impl Services {
    /// Starts the services `config` asks for. The broker's presets are
    /// expanded here, from the host tools' configuration; nothing in the
    /// workspace (`workspace`, the host path) is run or read for it.
    pub(crate) async fn start(
        config: &SandboxConfig,
        workspace: &str,
        channel: Channel,
    ) -> Result<Services> {
        let Some(egress) = config
            .egress
            .as_ref()
            .filter(|_| config.network == Network::Allow)
        else {
            return Ok(Services {
                egress: None,
                relay: Arc::new(NetRelay::new(None, MAX_DIALS)),
            });
        };
        let env = PresetEnv::from_host().untrusting(workspace);
        let (policy, warnings) = cordon_net::preset_table::expand(&egress.spec, &env)
            .await
            .map_err(|e| Error::Config(format!("network policy: {e}")))?;
        for w in &warnings {
            tracing::warn!("network policy: {w}");
        }
        let (host_end, sandbox_end) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| Error::Io(e.into()))?;
        let (events, _) = broadcast::channel(EVENT_BACKLOG);
        let policy = PolicyHandle::new(policy);
        let broker = Broker::new(
            policy.clone(),
            egress.resolver.clone(),
            Arc::new(Tee {
                events: events.clone(),
                sink: egress.events.clone(),
            }),
            egress.broker.clone(),
        );
        let info = NetworkInfo {
            policy,
            warnings,
            events,
            broker: broker.clone(),
            intercept: egress.broker.intercept.clone(),
        };
        let (relay, host_end, sandbox_end) = match channel {
            Channel::Socket => (
                NetRelay::new(None, MAX_DIALS),
                Some(host_end),
                Some(sandbox_end),
            ),
            Channel::Relay => (
                NetRelay::new(
                    Some(broker.clone()),
                    egress.broker.max_connections + MAX_DIALS,
                ),
                None,
                None,
            ),
        };
        Ok(Services {
            egress: Some(EgressService {
                broker,
                info,
                host_end: Mutex::new(host_end),
                sandbox_end: Mutex::new(sandbox_end),
            }),
            relay: Arc::new(relay),
        })
    }

    /// The connections carried over the control channel.
    pub(crate) fn relay(&self) -> &Arc<NetRelay> {
        &self.relay
    }

    /// The live egress, with [`Network::Allow`].
    pub(crate) fn network(&self) -> Option<&NetworkInfo> {
        self.egress.as_ref().map(|e| &e.info)
    }

    /// The port the supervisor is to listen on for the broker, if any.
    pub(crate) fn proxy_port(&self) -> Option<u16> {
        self.egress.as_ref().map(|_| PROXY_PORT)
    }

    /// Runs `f` with the supervisor's end of the services channel, if there
    /// is one, to launch the supervisor with it.
    pub(crate) fn with_sandbox_end<T>(&self, f: impl FnOnce(Option<BorrowedFd<'_>>) -> T) -> T {
        let end = self
            .egress
            .as_ref()
            .map(|e| e.sandbox_end.lock().unwrap_or_else(|p| p.into_inner()));
        f(end.as_ref().and_then(|g| g.as_ref().map(|fd| fd.as_fd())))
    }

    /// The supervisor holds its end now: the host's copy goes, so that the
    /// channel ends when the supervisor does.
    pub(crate) fn launched(&self) {
        if let Some(e) = &self.egress {
            e.sandbox_end
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
        }
    }

    /// The supervisor is ready: takes the broker's listener it sent and
    /// starts serving it. An error here ends the sandbox's creation.
    pub(crate) fn ready(&self) -> Result<()> {
        let Some(e) = &self.egress else {
            return Ok(());
        };
        let Some(host_end) = e.host_end.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        let listener = receive_listener(&host_end)?;
        let listener = std::net::TcpListener::from(listener);
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let broker = e.broker.clone();
        tokio::spawn(async move {
            if let Err(err) = broker.serve(listener).await {
                tracing::warn!("the network broker stopped: {err}");
            }
        });
        Ok(())
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        if let Some(e) = &self.egress {
            // Ends the serving loop and every tunnel still open.
            e.broker.close();
        }
    }
}

/// The one descriptor the supervisor sent, which must be a listening TCP
/// socket. It was sent before the supervisor reported ready, so it is
/// waiting: the receive does not block.
fn receive_listener(channel: &OwnedFd) -> Result<OwnedFd> {
    let setup = |what: &str| Error::Setup {
        message: format!("the network broker's listener: {what}"),
        errno: 0,
    };
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    rustix::net::recvmsg(
        channel,
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| setup(&format!("not received ({e})")))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    let [fd] = <[OwnedFd; 1]>::try_from(fds).map_err(|_| setup("not one descriptor"))?;
    // What the supervisor sent is checked, not trusted: a TCP socket that
    // listens.
    let listening = rustix::net::sockopt::socket_acceptconn(&fd).unwrap_or(false);
    let tcp = rustix::net::sockopt::socket_type(&fd).is_ok_and(|t| t == SocketType::STREAM)
        && rustix::net::getsockname(&fd).is_ok_and(|a| {
            matches!(
                a.address_family(),
                AddressFamily::INET | AddressFamily::INET6
            )
        });
    if !(listening && tcp) {
        return Err(setup("not a listening TCP socket"));
    }
    Ok(fd)
}
