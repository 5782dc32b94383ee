//! Choosing the accelerator: KVM when this host's /dev/kvm has been seen
//! to run a guest (a throw-away one boots once per host boot to find out,
//! and the answer is cached), else QEMU's TCG emulation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{MIN_MEMORY, create, image};
use crate::config::{Accel, BackendKind, SandboxConfig, VmOptions};
use crate::session::ExecRequest;

/// The host's TSC frequency in kHz, which a TCG guest runs its clock from:
/// calibrating it against emulated timers hangs now and then.
pub(super) fn tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let flags = info.lines().find(|l| l.starts_with("flags"))?;
    if !flags.contains(" constant_tsc") {
        return None;
    }
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    Some((mhz * 1000.0) as u64)
}

/// How long a KVM guest may take to answer before the probe gives up: a
/// booting guest answers in well under a second; a /dev/kvm that cannot
/// run guests (nested virtualisation) fails at once or hangs for ever.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(8);

/// The accelerator to use: the configured one, or KVM if this host's
/// /dev/kvm has been seen to run a guest. The device's presence proves
/// nothing, so the first sandbox after each host boot probes by booting one
/// (see [`probe_kvm`]) and the answer is cached until the next boot.
pub(super) async fn accel(config: &SandboxConfig) -> Accel {
    if let Some(a) = config.vm.accel {
        return a;
    }
    static CHOSEN: tokio::sync::OnceCell<Accel> = tokio::sync::OnceCell::const_new();
    *CHOSEN
        .get_or_init(|| async {
            // `said`: this host was told already, by the run that probed.
            let (accel, why, said) = match cached_probe() {
                Some(a) => (
                    a,
                    "a KVM guest did not run when probed after this host booted; `cordon doctor` says why".to_string(),
                    true,
                ),
                None if !Path::new("/dev/kvm").exists() => (Accel::Tcg, "no /dev/kvm".into(), false),
                None => {
                    let result = probe_kvm(config).await;
                    let accel = if result.is_ok() { Accel::Kvm } else { Accel::Tcg };
                    (accel, result.err().unwrap_or_default(), false)
                }
            };
            if accel == Accel::Tcg {
                let message = format!(
                    "microvm: KVM cannot run guests here ({why}); using QEMU's TCG emulation, which is slow"
                );
                if said {
                    tracing::info!("{message}");
                } else {
                    tracing::warn!("{message}");
                }
            }
            accel
        })
        .await
}

/// Boots a throw-away guest with KVM; Ok with the time to its first exec,
/// or why it did not run. The answer is recorded for this host boot, where
/// choosing the accelerator finds it. `cordon doctor` shows it.
pub async fn probe_kvm(config: &SandboxConfig) -> std::result::Result<Duration, String> {
    let result = try_kvm(config).await;
    save_probe(if result.is_ok() {
        Accel::Kvm
    } else {
        Accel::Tcg
    });
    result
}

async fn try_kvm(config: &SandboxConfig) -> std::result::Result<Duration, String> {
    if !Path::new("/dev/kvm").exists() {
        return Err("no /dev/kvm".into());
    }
    let dir = image::cache_dir().join("probe");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut c = SandboxConfig::new(&dir);
    c.backend = BackendKind::Microvm;
    c.supervisor = config.supervisor.clone();
    c.vm = VmOptions {
        accel: Some(Accel::Kvm),
        ..config.vm.clone()
    };
    c.memory = Some(MIN_MEMORY);
    let start = std::time::Instant::now();
    let attempt = async {
        // Boxed: creating a microVM may itself come here to probe. No
        // display and no disk budget: the backend alone makes the sandbox.
        let sb = Box::pin(create(&c)).await.map_err(|e| e.to_string())?;
        let out = sb
            .exec(ExecRequest::argv(["/bin/true"]))
            .await
            .map_err(|e| e.to_string());
        sb.close().await;
        match out {
            Ok(o) if o.status.success() => Ok(start.elapsed()),
            Ok(o) => Err(format!("the guest's /bin/true exited {:?}", o.status)),
            Err(e) => Err(e),
        }
    };
    match tokio::time::timeout(KVM_PROBE_TIMEOUT, attempt).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!(
            "a KVM guest failed: {}",
            e.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("")
        )),
        Err(_) => Err(format!(
            "a KVM guest did not answer within {} s",
            KVM_PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// The probe's file: this boot's id and the accelerator found.
fn probe_file() -> PathBuf {
    image::cache_dir().join("accel")
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

fn cached_probe() -> Option<Accel> {
    let text = std::fs::read_to_string(probe_file()).ok()?;
    let (id, accel) = text.trim().split_once(' ')?;
    if Some(id) != boot_id().as_deref() {
        return None;
    }
    accel.parse().ok()
}

fn save_probe(accel: Accel) {
    let Some(id) = boot_id() else { return };
    let name = match accel {
        Accel::Kvm => "kvm",
        Accel::Tcg => "tcg",
    };
    let path = probe_file();
    let tmp = path.with_extension(format!("{}", std::process::id()));
    if std::fs::write(&tmp, format!("{id} {name}\n")).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}
