//! Creating a sandbox, above the backends: the one the configuration names
//! builds it through the [`Backend`] trait, then the disk budget's watcher
//! and the display start on it.

use crate::backend::Backend;
use crate::config::{BackendKind, DISPLAY, SandboxConfig};
use crate::error::Result;
use crate::microvm::MicrovmBackend;
use crate::native::NativeBackend;
use crate::session::Sandbox;

impl BackendKind {
    /// The backend of this kind.
    pub fn backend(self) -> &'static dyn Backend {
        match self {
            BackendKind::Native => &NativeBackend,
            BackendKind::Microvm => &MicrovmBackend,
        }
    }
}

impl Sandbox {
    /// Creates a sandbox with the backend `config.backend` names; with
    /// `config.display`, its X display is up when this returns.
    pub async fn create(config: SandboxConfig) -> Result<Sandbox> {
        let mut config = config;
        if config.display.is_some() {
            crate::config::put_env(&mut config.env, "DISPLAY", DISPLAY);
        }
        // What the workspace takes before the sandbox can write, measured
        // while the sandbox starts.
        let baseline = crate::disk::Baseline::start(&config)?;
        let sandbox = config.backend.backend().create(&config).await?;
        if let Some(b) = baseline {
            b.watch(&sandbox).await?;
        }
        if let Some(d) = config.display
            && let Err(e) = sandbox.start_display(d).await
        {
            sandbox.close().await;
            return Err(e);
        }
        for p in &config.ports {
            match sandbox.forward(p.host, p.port).await {
                Ok(f) => sandbox
                    .inner
                    .forwards
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(f),
                Err(e) => {
                    sandbox.close().await;
                    return Err(e);
                }
            }
        }
        Ok(sandbox)
    }
}
