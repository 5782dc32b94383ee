//! `cordon mcp --listen`: the sandbox's tools over Streamable HTTP on a
//! loopback address, for the user who started it only. Loopback is shared
//! by every local user and reachable from the user's browser, so each
//! request must carry this instance's token (`Authorization: Bearer`,
//! compared in constant time), and a request from a web page (an `Origin`
//! other than this server's own) is refused; rmcp refuses a foreign
//! `Host` (DNS rebinding).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use cordon_sandbox::SandboxConfig;
use subtle::ConstantTimeEq;

use crate::exit;

/// The environment variable that sets the token instead of a random one.
pub const TOKEN_ENV: &str = "CORDON_MCP_TOKEN";

/// Who may use the instance.
struct Access {
    token: String,
    /// This server's own origins, lowercase.
    origins: Vec<String>,
}

/// The token from [`TOKEN_ENV`], or a new random one (and whether it is
/// new, so worth telling).
fn token() -> Result<(String, bool), String> {
    match std::env::var(TOKEN_ENV) {
        Ok(t) if t.len() >= 16 && t.bytes().all(|b| b.is_ascii_graphic()) => Ok((t, false)),
        Ok(_) => Err(format!(
            "{TOKEN_ENV} must be at least 16 printable ASCII characters without spaces; \
             unset it to have a random token made"
        )),
        Err(_) => Ok((
            format!("cmcp_{}", cordon_server::store::random_hex(24)),
            true,
        )),
    }
}

/// Writes the token to `path`, readable by its owner only: a new file
/// renamed over whatever was there (a link at `path` is replaced, not
/// followed).
fn write_token(path: &Path, token: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = f
        .write_all(format!("{token}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The origins a page served by this very server would send.
fn own_origins(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let mut hosts = vec!["localhost".to_string()];
    hosts.push(match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    });
    hosts
        .iter()
        .flat_map(|h| {
            let mut o = vec![format!("http://{h}:{port}")];
            if port == 80 {
                o.push(format!("http://{h}"));
            }
            o
        })
        .collect()
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut r = (status, format!("{message}\n")).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

async fn check(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    // No Origin is a client that is not a browser: the token decides.
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| access.origins.iter().any(|own| own.eq_ignore_ascii_case(o)));
        if !ok {
            return refuse(
                StatusCode::FORBIDDEN,
                "Forbidden: requests from web pages (an Origin other than this server's) are refused",
            );
        }
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let ok = given.is_some_and(|t| bool::from(t.as_bytes().ct_eq(access.token.as_bytes())));
    if !ok {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: send `Authorization: Bearer TOKEN` with the token `cordon mcp --listen` \
             printed or wrote to --token-file",
        );
    }
    next.run(request).await
}

/// Serves until Ctrl-C.
pub async fn serve(config: SandboxConfig, addr: SocketAddr, token_file: Option<PathBuf>) -> i32 {
    if !addr.ip().is_loopback() {
        eprintln!(
            "cordon: --listen {addr}: only a loopback address is allowed; \
             `cordon serve` offers /mcp to other machines, behind its tenants' tokens"
        );
        return exit::SANDBOX;
    }
    let (token, made) = match token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::CONFIG;
        }
    };
    if let Some(path) = &token_file
        && let Err(e) = write_token(path, &token)
    {
        eprintln!("cordon: cannot write the token to {}: {e}", path.display());
        return exit::CONFIG;
    }
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cordon: cannot listen on {addr}: {e}");
            return exit::SANDBOX;
        }
    };
    let bound = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::SANDBOX;
        }
    };
    let (service, _sessions) = cordon_mcp::http_service(
        move || config.clone(),
        std::time::Duration::from_secs(30 * 60),
        cordon_mcp::Exposure::Local,
    );
    let access = Arc::new(Access {
        token: token.clone(),
        origins: own_origins(bound),
    });
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(access, check));
    match (&token_file, made) {
        (Some(p), _) => eprintln!("cordon: the token is in {}", p.display()),
        (None, true) => eprintln!("cordon: token (send as `Authorization: Bearer …`): {token}"),
        (None, false) => eprintln!("cordon: the token is {TOKEN_ENV}'s"),
    }
    eprintln!("cordon: MCP on http://{bound}/mcp");
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    // Small streamed answers must not wait for the client's delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
    });
    match axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cordon: {e}");
            1
        }
    }
}
