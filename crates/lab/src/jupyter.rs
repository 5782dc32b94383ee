//! JupyterLab's server, started inside a sandbox on a Unix socket.
//!
//! It runs from the read-only environment the crate's `offer` binds, as the
//! sandbox's own user, in the workspace, with its runtime, settings and
//! data in the sandbox's private /tmp: nothing about it is the host's. It
//! listens only on [`SOCKET`]; the host reaches it through
//! [`cordon_sandbox::Sandbox::connect_unix`], and cordon, not Jupyter, decides
//! who may (Jupyter's own token is off). It lives until the sandbox ends.

use std::time::Duration;

use cordon_sandbox::{ExecRequest, ExitStatus, Sandbox};

use crate::{SANDBOX_DIR, SANDBOX_PYTHON};

/// Where JupyterLab listens inside the sandbox.
pub const SOCKET: &str = "/tmp/.cordon-lab/lab.sock";

/// The exit code of the start script when the environment is missing.
const NOT_INSTALLED: i32 = 127;

/// Why JupyterLab could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "JupyterLab is not installed for sandboxes: run `cordon lab setup` on the host \
         (or this sandbox has its own bind at {SANDBOX_DIR})"
    )]
    NotInstalled,
    #[error("JupyterLab did not start in the sandbox: {0}")]
    Failed(String),
    #[error(transparent)]
    Sandbox(#[from] cordon_sandbox::Error),
}

/// Kernels speak ZeroMQ over Unix sockets in the runtime directory
/// (`KernelManager.transport=ipc`): a sandbox without the network has no
/// loopback to bind.
///
/// Starts JupyterLab in `sandbox` serving under `base` (a path that starts
/// and ends with `/`), unless it already runs there; returns once it
/// listens. Two callers at once start one server.
pub async fn start(sandbox: &Sandbox, base: &str) -> Result<(), StartError> {
    // Under TCG a microVM takes many times longer to import Jupyter.
    let wait = if sandbox.info().backend == "microvm" {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(60)
    };
    let polls = wait.as_millis() / 50;
    // The base travels as an argument, never spliced into the script.
    // setsid keeps the server out of this exec's process group, which is
    // killed when the exec ends.
    let script = format!(
        r#"[ -x {SANDBOX_PYTHON} ] || exit {NOT_INSTALLED}
dir=/tmp/.cordon-lab
mkdir -p $dir && chmod 700 $dir
exec 9>$dir/lock
flock 9
if [ -S {SOCKET} ] && kill -0 "$(cat $dir/pid 2>/dev/null)" 2>/dev/null; then exit 0; fi
rm -f {SOCKET}
export JUPYTER_RUNTIME_DIR=$dir/runtime JUPYTER_DATA_DIR=$dir/data JUPYTER_CONFIG_DIR=$dir/config \
    JUPYTERLAB_SETTINGS_DIR=$dir/settings JUPYTERLAB_WORKSPACES_DIR=$dir/workspaces \
    JUPYTER_PLATFORM_DIRS=1 PYTHONNOUSERSITE=1
setsid {SANDBOX_PYTHON} -m jupyterlab --no-browser --allow-root \
    --ServerApp.sock={SOCKET} --ServerApp.base_url="$1" \
    --IdentityProvider.token= --ServerApp.password= --ServerApp.allow_remote_access=True \
    --ServerApp.root_dir=/workspace --LabApp.extension_manager=readonly --KernelManager.transport=ipc \
    --LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
    </dev/null >$dir/log 2>&1 9>&- &
echo $! > $dir/pid
i=0
while [ ! -S {SOCKET} ]; do
    i=$((i + 1))
    if [ $i -gt {polls} ] || ! kill -0 $! 2>/dev/null; then tail -n 20 $dir/log >&2; exit 1; fi
    sleep 0.05
done"#
    );
    let out = sandbox
        .exec(ExecRequest {
            timeout: Some(wait + Duration::from_secs(10)),
            ..ExecRequest::argv(["/bin/sh", "-c", &script, "cordon-lab", base])
        })
        .await?;
    match out.status {
        ExitStatus::Code(0) => Ok(()),
        ExitStatus::Code(NOT_INSTALLED) => Err(StartError::NotInstalled),
        _ => Err(StartError::Failed(
            // The log is the sandbox's to write: shown as text, escaped by
            // whoever prints it.
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
    }
}
