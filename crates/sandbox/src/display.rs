//! A sandbox's virtual screen: Xvfb and a window manager inside it, and a
//! live view of it over VNC.
//!
//! The VNC server (x11vnc) runs inside the sandbox too and listens on a Unix
//! socket in the sandbox's own /tmp, never on a network port. A viewer
//! reaches it through an exec: a small relay inside the sandbox copies the
//! exec's stdin to the socket and the socket to its stdout, so the host
//! only ever moves bytes and the RFB server stays confined like everything
//! else the sandbox runs.

use std::time::Duration;

use crate::config::{DISPLAY, Display};
use crate::error::{Error, Result};
use crate::protocol::ExitStatus;
use crate::session::{ExecRequest, Execution, Sandbox};

/// What a live viewer may do with the desktop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VncAccess {
    /// See the screen; keyboard and pointer input are dropped by the
    /// server (x11vnc `-viewonly`), whatever the viewer sends.
    ViewOnly,
    /// See the screen and drive it.
    Control,
}

impl VncAccess {
    fn name(self) -> &'static str {
        match self {
            VncAccess::ViewOnly => "view",
            VncAccess::Control => "control",
        }
    }
}

impl Sandbox {
    /// The virtual screen this sandbox was created with, if any.
    pub fn display(&self) -> Option<Display> {
        self.inner.display.get().copied()
    }

    /// How long starting Xvfb, the window manager or x11vnc may take. Under
    /// TCG they take seconds of emulated CPU (Xvfb 1.5 s and openbox 4 s on
    /// an idle machine), so a microVM gets more room.
    fn display_setup_timeout(&self) -> Duration {
        if self.info().backend == "microvm" {
            Duration::from_secs(90)
        } else {
            Duration::from_secs(20)
        }
    }

    /// Starts Xvfb inside the sandbox and waits for its socket, then a
    /// window manager if one is installed. Both outlive this exec, as
    /// background processes of the session; their output goes to files so
    /// that nothing writes to the exec's closed pipes.
    pub(crate) async fn start_display(&self, d: Display) -> Result<()> {
        let n = DISPLAY.trim_start_matches(':');
        let script = format!(
            r#"command -v Xvfb >/dev/null || {{ echo "Xvfb is not installed (Debian: apt-get install xvfb)" >&2; exit 127; }}
Xvfb :{n} -screen 0 {w}x{h}x24 -nolisten tcp -noreset >/tmp/.cordon-xvfb.log 2>&1 &
i=0
while [ ! -S /tmp/.X11-unix/X{n} ]; do
    i=$((i + 1))
    if [ $i -gt 400 ] || ! kill -0 $! 2>/dev/null; then cat /tmp/.cordon-xvfb.log >&2; exit 1; fi
    sleep 0.025
done
for wm in openbox matchbox-window-manager; do
    if command -v $wm >/dev/null; then $wm >/tmp/.cordon-wm.log 2>&1 & break; fi
done
# A window mapped while the window manager is still starting can be lost
# (it stays unmapped for good): wait until the manager announces itself.
if command -v xprop >/dev/null && [ -n "${{wm:-}}" ] && command -v $wm >/dev/null; then
    i=0
    until DISPLAY=:{n} xprop -root _NET_SUPPORTING_WM_CHECK 2>/dev/null | grep -q 'window id'; do
        i=$((i + 1))
        if [ $i -gt 200 ]; then break; fi
        sleep 0.025
    done
fi"#,
            w = d.width,
            h = d.height,
        );
        let out = self
            .exec(ExecRequest {
                timeout: Some(self.display_setup_timeout()),
                ..ExecRequest::shell(&script)
            })
            .await?;
        if out.status != ExitStatus::Code(0) {
            return Err(Error::Setup {
                message: format!(
                    "the X display did not start: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                errno: 0,
            });
        }
        let _ = self.inner.display.set(d);
        Ok(())
    }

    /// Opens a live view of the desktop: an execution whose stdin and
    /// stdout carry one RFB (VNC) connection, from the protocol version
    /// handshake on. Dropping it, or closing its stdin, ends the connection.
    ///
    /// One x11vnc per access mode is started on first use and then shared
    /// by every viewer of that mode, so opening a second view is cheap.
    pub async fn vnc(&self, access: VncAccess) -> Result<Execution> {
        if self.display().is_none() {
            return Err(Error::Display(
                "this sandbox has no display (create it with one)".into(),
            ));
        }
        let mode = access.name();
        let view_only = if access == VncAccess::ViewOnly {
            "-viewonly"
        } else {
            ""
        };
        // Serialised by flock so that two viewers arriving together start
        // one server. setsid keeps it out of this exec's process group,
        // which is killed when the exec ends.
        let script = format!(
            r#"command -v x11vnc >/dev/null || {{ echo "x11vnc is not installed (Debian: apt-get install x11vnc)" >&2; exit 127; }}
dir=/tmp/.cordon-vnc
mkdir -p $dir && chmod 700 $dir
exec 9>$dir/{mode}.lock
flock 9
sock=$dir/{mode}.sock
if [ -S $sock ] && kill -0 "$(cat $dir/{mode}.pid 2>/dev/null)" 2>/dev/null; then exit 0; fi
rm -f $sock
setsid x11vnc -display {display} -unixsock $sock -rfbport 0 -noipv6 -shared -forever -nopw -quiet -xkb {view_only} \
    -o $dir/{mode}.log </dev/null >/dev/null 2>&1 9>&- &
echo $! > $dir/{mode}.pid
i=0
while [ ! -S $sock ]; do
    i=$((i + 1))
    if [ $i -gt 400 ] || ! kill -0 $! 2>/dev/null; then tail -n 20 $dir/{mode}.log >&2; exit 1; fi
    sleep 0.025
done"#,
            display = DISPLAY,
        );
        let out = self
            .exec(ExecRequest {
                timeout: Some(self.display_setup_timeout()),
                ..ExecRequest::shell(&script)
            })
            .await?;
        if out.status != ExitStatus::Code(0) {
            return Err(Error::Display(format!(
                "the VNC server did not start: {}",
                out.stderr_str().trim()
            )));
        }
        self.connect_unix(&format!("/tmp/.cordon-vnc/{mode}.sock"))
            .await
            .map_err(|e| match e {
                e if e.is_not_found() => {
                    Error::Display("the live view needs python3 inside the sandbox".into())
                }
                e => e,
            })
    }
}
