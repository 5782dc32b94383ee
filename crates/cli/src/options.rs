//! Sandbox options shared by `run`, `shell` and, later, every front end.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use cordon_sandbox::{BindMount, Network, SandboxConfig, parse_size};

#[derive(Args, Debug, Clone)]
pub struct SandboxOpts {
    /// Host directory mounted read-write at /workspace [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Memory limit for the whole sandbox (K, M, G suffixes)
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub memory: u64,
    /// Maximum number of processes in the sandbox
    #[arg(long, default_value_t = 256)]
    pub pids: u64,
    /// Size of the /tmp tmpfs (K, M, G suffixes)
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub tmp_size: u64,
    /// Network access: off (no interface up) or loopback
    #[arg(long, default_value = "off", value_name = "MODE")]
    pub network: Network,
    /// Set an environment variable in the sandbox (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Bind a host path read-only: PATH or HOST_PATH:SANDBOX_PATH (repeatable)
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<String>,
    /// Bind a host path read-write: PATH or HOST_PATH:SANDBOX_PATH (repeatable)
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<String>,
    /// Working directory inside the sandbox
    #[arg(long, default_value = "/workspace", value_name = "DIR")]
    pub workdir: String,
    /// Start a virtual X display of this size inside the sandbox (Xvfb and a
    /// window manager; DISPLAY is set for the command)
    #[arg(long, value_name = "WxH")]
    pub display: Option<cordon_sandbox::Display>,
    /// Isolation backend: native (namespaces on this kernel) or microvm (a
    /// QEMU virtual machine with its own kernel; see `cordon vm setup`)
    #[arg(
        long,
        env = "CORDON_BACKEND",
        default_value = "native",
        value_name = "NAME"
    )]
    pub backend: cordon_sandbox::BackendKind,
    /// Virtual CPUs of a microVM [default: 1]
    #[arg(long, env = "CORDON_CPUS", value_name = "N")]
    pub cpus: Option<u32>,
    /// microvm: QEMU's accelerator, kvm or tcg [default: kvm where a probe guest boots on it, else tcg]
    #[arg(long, env = "CORDON_VM_ACCEL", value_name = "ACCEL", hide = true)]
    pub vm_accel: Option<cordon_sandbox::Accel>,
    /// microvm: the guest kernel (vmlinuz or vmlinux) [default: `cordon vm setup`'s]
    #[arg(long, env = "CORDON_VM_KERNEL", value_name = "PATH", hide = true)]
    pub vm_kernel: Option<PathBuf>,
    /// microvm: the guest kernel's modules directory
    #[arg(long, env = "CORDON_VM_MODULES", value_name = "DIR", hide = true)]
    pub vm_modules: Option<PathBuf>,
    /// microvm: the QEMU binary
    #[arg(long, env = "CORDON_VM_QEMU", value_name = "PATH", hide = true)]
    pub vm_qemu: Option<PathBuf>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got {s:?}"))?;
    if k.is_empty() || k.contains('\0') || v.contains('\0') {
        return Err(format!("invalid variable name in {s:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Parses a `--set KEY=VALUE` override of a setting.
pub fn parse_setting(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// Parses a `--timeout` value: `30s`, `5m`, `1h30m`, `250ms`, or plain seconds.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("timeout must be positive, got {s:?}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn parse_bind(spec: &str, writable: bool) -> Result<BindMount, String> {
    let (src, dst) = match spec.split_once(':') {
        Some((s, d)) => (s, d.to_string()),
        None => (spec, String::new()),
    };
    let source = PathBuf::from(src);
    let target = if dst.is_empty() {
        std::path::absolute(&source)
            .map_err(|e| format!("{src}: {e}"))?
            .to_string_lossy()
            .into_owned()
    } else {
        dst
    };
    Ok(BindMount {
        source,
        target,
        writable,
    })
}

impl SandboxOpts {
    pub fn config(&self) -> Result<SandboxConfig, String> {
        let workspace = match &self.workspace {
            Some(w) => w.clone(),
            None => std::env::current_dir().map_err(|e| format!("current directory: {e}"))?,
        };
        let mut c = SandboxConfig::new(workspace);
        c.memory = Some(self.memory);
        c.pids = Some(self.pids);
        c.tmp_size = self.tmp_size;
        c.network = self.network;
        c.env = self.env.clone();
        c.workdir = self.workdir.clone();
        c.display = self.display;
        c.backend = self.backend;
        c.cpus = self.cpus;
        c.vm = cordon_sandbox::VmOptions {
            qemu: self.vm_qemu.clone(),
            kernel: self.vm_kernel.clone(),
            modules: self.vm_modules.clone(),
            accel: self.vm_accel,
        };
        // The CLI holds nothing secret when it creates the sandbox.
        c.fork_supervisor = true;
        for b in &self.ro {
            c.binds.push(parse_bind(b, false)?);
        }
        for b in &self.rw {
            c.binds.push(parse_bind(b, true)?);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_timeout("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_timeout("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_timeout("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("-3").is_err());
        assert!(parse_timeout("soon").is_err());
    }

    #[test]
    fn env_and_binds_parse() {
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(parse_env("novalue").is_err());
        assert!(parse_env("=x").is_err());
        let b = parse_bind("/opt/data:/data", false).unwrap();
        assert_eq!(
            (b.source, b.target.as_str(), b.writable),
            (PathBuf::from("/opt/data"), "/data", false)
        );
        let b = parse_bind("/srv", true).unwrap();
        assert_eq!(b.target, "/srv");
    }
}
