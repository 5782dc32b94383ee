//! Defence in depth applied to the supervisor once the root is built, and so
//! inherited by every process it starts: rlimits, `no_new_privs`, Landlock,
//! an empty capability set and a seccomp filter.

use std::collections::BTreeMap;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};
use rustix::io::Errno;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::error::SetupError;
use crate::protocol::SetupSpec;

type Result<T> = std::result::Result<T, SetupError>;

/// What was put in force, reported to the host.
pub struct Confinement {
    pub landlock: String,
    pub landlock_abi: i32,
    pub seccomp_filters: u32,
    /// Under an image root: the supervisor's end of the set-id gate.
    pub setid: Option<super::setid::Gate>,
}

pub fn apply(spec: &SetupSpec, writable: &[String]) -> Result<Confinement> {
    apply_rlimits(spec)?;
    rustix::thread::set_no_new_privs(true).map_err(|e| SetupError::new("set no_new_privs", e))?;
    let (landlock, landlock_abi) = apply_landlock(spec, writable)?;
    if spec.image.is_some() {
        keep_image_capabilities()?;
    } else {
        drop_capabilities()?;
    }
    // Capability changes reset dumpability; set it last so that processes of
    // the same uid can neither ptrace the supervisor nor open /proc/1/*.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| SetupError::new("clear dumpable", e))?;
    let image = spec.image.is_some();
    let filters = build_seccomp(!image)?;
    for f in &filters {
        seccompiler::apply_filter(f).map_err(|e| SetupError {
            what: format!("install seccomp filter: {e}"),
            errno: 0,
        })?;
    }
    // Last: it sends the chmod calls the main filter lets by to the gate.
    let setid = if image {
        Some(super::setid::Gate::install()?)
    } else {
        None
    };
    Ok(Confinement {
        landlock,
        landlock_abi,
        seccomp_filters: filters.len() as u32 + u32::from(image),
        setid,
    })
}

fn apply_rlimits(spec: &SetupSpec) -> Result<()> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let set = |res, what: &str, v: u64| {
        setrlimit(
            res,
            Rlimit {
                current: Some(v),
                maximum: Some(v),
            },
        )
        .map_err(|e| SetupError::new(format!("setrlimit {what}"), e))
    };
    if let Some(mem) = spec.rlimit_memory {
        // RLIMIT_DATA rather than RLIMIT_AS: runtimes such as node and Go
        // reserve large inaccessible address ranges that AS would count.
        set(Resource::Data, "DATA", mem)?;
    }
    if let Some(n) = spec.rlimit_nproc {
        set(Resource::Nproc, "NPROC", n)?;
    }
    if let Some(c) = &spec.user_counts {
        // Each bounds what the sandbox is charged in its own namespace, and
        // so its part of its owner's total (see `counts`).
        set(Resource::Sigpending, "SIGPENDING", c.sigpending)?;
        set(Resource::Msgqueue, "MSGQUEUE", c.msgqueue)?;
        set(Resource::Memlock, "MEMLOCK", c.memlock)?;
    }
    if let Some(n) = spec.rlimit_fsize {
        set(Resource::Fsize, "FSIZE", n)?;
    }
    if let Some(nice) = spec.nice {
        // Everything in the sandbox inherits it; raising one's own nice
        // needs no privilege.
        // SAFETY: setpriority on this process alone.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, 0, nice);
        }
    }
    set(Resource::Core, "CORE", 0)
}

fn apply_landlock(spec: &SetupSpec, writable: &[String]) -> Result<(String, i32)> {
    let err = |e: landlock::RulesetError| SetupError {
        what: format!("landlock: {e}"),
        errno: 0,
    };
    let abi = ABI::V6;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(err)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(err)?;
    if !spec.loopback && !spec.host_network {
        // No interface can carry traffic anyway; this makes TCP fail early
        // and stays in force if a future bug left an interface behind.
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(err)?;
    }
    let status = ruleset
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(["/"], read))
        .map_err(err)?
        .add_rules(path_beneath_rules(writable, all))
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    let kernel_abi = landlock_abi_version();
    let text = match status.ruleset {
        RulesetStatus::FullyEnforced => format!("fully enforced (kernel ABI {kernel_abi})"),
        RulesetStatus::PartiallyEnforced => {
            format!("partially enforced (kernel ABI {kernel_abi} is older than 6)")
        }
        RulesetStatus::NotEnforced => "not enforced (Landlock unavailable in this kernel)".into(),
    };
    Ok((text, kernel_abi))
}

/// The kernel's Landlock ABI version, or 0 when unavailable.
pub fn landlock_abi_version() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query takes a null attr and size 0.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

fn drop_capabilities() -> Result<()> {
    use rustix::thread::{CapabilitiesSecureBits as B, CapabilitySet};
    // Lock root out of ever regaining capabilities through exec or setuid.
    restrict_capabilities(
        CapabilitySet::empty(),
        B::NO_ROOT
            | B::NO_ROOT_LOCKED
            | B::NO_SETUID_FIXUP
            | B::NO_SETUID_FIXUP_LOCKED
            | B::KEEP_CAPS_LOCKED
            | B::NO_CAP_AMBIENT_RAISE
            | B::NO_CAP_AMBIENT_RAISE_LOCKED,
    )
}

/// Sets `bits`, then leaves this process `keep` and nothing more: in its
/// bounding set (capabilities newer than rustix knows dropped by number),
/// permitted and effective sets, with no inheritable or ambient ones.
fn restrict_capabilities(
    keep: rustix::thread::CapabilitySet,
    bits: rustix::thread::CapabilitiesSecureBits,
) -> Result<()> {
    use rustix::thread::{
        CapabilitySet, CapabilitySets, clear_ambient_capability_set,
        remove_capability_from_bounding_set, set_capabilities, set_capabilities_secure_bits,
    };
    set_capabilities_secure_bits(bits).map_err(|e| SetupError::new("set securebits", e))?;
    for cap in CapabilitySet::all().iter() {
        if keep.contains(cap) {
            continue;
        }
        match remove_capability_from_bounding_set(cap) {
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(SetupError::new("drop bounding capability", e)),
        }
    }
    // Capabilities newer than this rustix knows about, by number.
    for raw in 41..64 {
        // SAFETY: PR_CAPBSET_DROP with an integer argument.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, raw, 0, 0, 0) };
        if rc != 0 {
            break;
        }
    }
    clear_ambient_capability_set().map_err(|e| SetupError::new("clear ambient caps", e))?;
    set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| SetupError::new("drop capabilities", e))
}

/// What root in an image sandbox keeps, for a package manager: owning
/// files as the image's users (`CHOWN`, `FOWNER`, `FSETID`), reading and
/// writing them whatever their modes (`DAC_OVERRIDE`), switching to them
/// (apt's `_apt`: `SETUID`, `SETGID`), signalling their processes (`KILL`),
/// file capabilities a package's script sets (`SETFCAP`), and ports below
/// 1024 (`NET_BIND_SERVICE`). Each holds over the sandbox's own user
/// namespace alone: over files whose owners its id map covers (the image's
/// layers, its writable layer, its workspace), over its own processes and
/// its own network namespace; the host's files show as unmapped ids, over
/// which no capability of the namespace counts. Nothing that reaches the
/// kernel's wider surface (`SYS_ADMIN`, `NET_ADMIN`, `SYS_PTRACE`,
/// `SYS_MODULE`...) is kept, and the seccomp filter is unchanged.
fn image_capabilities() -> rustix::thread::CapabilitySet {
    use rustix::thread::CapabilitySet as C;
    C::CHOWN
        | C::DAC_OVERRIDE
        | C::FOWNER
        | C::FSETID
        | C::KILL
        | C::SETGID
        | C::SETUID
        | C::SETFCAP
        | C::NET_BIND_SERVICE
}

/// Keeps [`image_capabilities`] for root in an image sandbox, with the
/// usual rules for the rest: a command that switches to another user
/// loses them, and exec gives root at most these (the bounding set).
fn keep_image_capabilities() -> Result<()> {
    use rustix::thread::CapabilitiesSecureBits as B;
    restrict_capabilities(
        image_capabilities(),
        B::NO_CAP_AMBIENT_RAISE | B::NO_CAP_AMBIENT_RAISE_LOCKED,
    )
}

/// `fchmodat2` (Linux 6.6); the same number on every architecture.
const SYS_FCHMODAT2: i64 = 452;
/// The bit of `O_TMPFILE` that is not `O_DIRECTORY`.
const O_TMPFILE_BIT: u64 = (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64;

const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

/// Syscalls that expose kernel attack surface an agent has no use for.
const DENIED: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_setns,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_quotactl,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
    libc::SYS_lookup_dcookie,
];

fn arch() -> Result<TargetArch> {
    std::env::consts::ARCH.try_into().map_err(|_| SetupError {
        what: format!(
            "seccomp: unsupported architecture {}",
            std::env::consts::ARCH
        ),
        errno: 0,
    })
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, val: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, len, op, val).map_err(|e| SetupError {
        what: format!("seccomp condition: {e}"),
        errno: 0,
    })
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule> {
    SeccompRule::new(conds).map_err(|e| SetupError {
        what: format!("seccomp rule: {e}"),
        errno: 0,
    })
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch()?,
    )
    .map_err(|e| SetupError {
        what: format!("seccomp filter: {e}"),
        errno: 0,
    })?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SetupError {
            what: format!("seccomp compile: {e}"),
            errno: 0,
        })
}

/// Builds the filters. Each filter has one errno, so there are four: the
/// deny list (EPERM), `clone3` and `openat2` (ENOSYS, so libc falls back to
/// calls whose arguments a filter can inspect), exotic socket families, and
/// `setgroups` (a no-op success). Without `chmod_setid`, the chmod calls
/// with set-id modes are left to the set-id gate (`setid`).
pub fn build_seccomp(chmod_setid: bool) -> Result<Vec<BpfProgram>> {
    use SeccompCmpArgLen::{Dword, Qword};
    use SeccompCmpOp::{Eq, MaskedEq};

    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&s| (s, vec![])).collect();
    let ns_rules = |arg: u8| -> Result<Vec<SeccompRule>> {
        CLONE_NS_FLAGS
            .iter()
            .map(|&f| rule(vec![cond(arg, Qword, MaskedEq(f), f)?]))
            .collect()
    };
    deny.insert(libc::SYS_unshare, ns_rules(0)?);
    deny.insert(libc::SYS_clone, ns_rules(0)?);
    // TIOCSTI and TIOCLINUX push input into a terminal; the kernel compares
    // only the low 32 bits of the request, so must we.
    deny.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, Dword, Eq, libc::TIOCSTI)?])?,
            rule(vec![cond(1, Dword, Eq, 0x541C)?])?,
        ],
    );
    deny_setid_modes(&mut deny, chmod_setid)?;
    let mut main = compile(deny, libc::EPERM)?;
    prepend_x32_guard(&mut main);

    // openat2 takes its mode inside a struct a filter cannot read; callers
    // fall back to openat on ENOSYS, as they do from clone3 to clone.
    let clone3 = compile(
        [(libc::SYS_clone3, vec![]), (libc::SYS_openat2, vec![])]
            .into_iter()
            .collect(),
        libc::ENOSYS,
    )?;

    let allowed_families = [
        libc::AF_UNIX,
        libc::AF_INET,
        libc::AF_INET6,
        libc::AF_NETLINK,
    ];
    let mut family_rules = Vec::new();
    // Deny anything outside the allowed set: express "not in set" as ranges
    // between the allowed values.
    let mut lo = 0u64;
    let mut sorted = allowed_families.map(|f| f as u64);
    sorted.sort_unstable();
    for &f in &sorted {
        if f > lo {
            family_rules.push(rule(vec![
                cond(0, Dword, SeccompCmpOp::Ge, lo)?,
                cond(0, Dword, SeccompCmpOp::Lt, f)?,
            ])?);
        }
        lo = f + 1;
    }
    family_rules.push(rule(vec![cond(0, Dword, SeccompCmpOp::Ge, lo)?])?);
    let families = compile(
        [(libc::SYS_socket, family_rules)].into_iter().collect(),
        libc::EAFNOSUPPORT,
    )?;

    // The sandbox has no supplementary groups and no CAP_SETGID, so a real
    // setgroups() always fails, and programs that drop groups before running
    // a child (xterm's initgroups) then refuse to start. Succeeding without
    // effect grants nothing: the group list is empty before and after.
    let setgroups = compile([(libc::SYS_setgroups, vec![])].into_iter().collect(), 0)?;

    Ok(vec![main, clone3, families, setgroups])
}

/// Files the sandbox writes to the workspace persist on the host, where a
/// setuid or setgid bit would hand the sandbox's identity (root's, when
/// root runs cordon) to whoever executes them later. The mode is a plain
/// argument of every call that can set it: refuse those bits there.
fn deny_setid_modes(deny: &mut BTreeMap<i64, Vec<SeccompRule>>, chmod: bool) -> Result<()> {
    use SeccompCmpArgLen::Dword;
    use SeccompCmpOp::MaskedEq;
    let special = |mode_arg: u8, flags_arg: Option<u8>| -> Result<Vec<SeccompRule>> {
        let mut rules = Vec::new();
        for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
            let mode = cond(mode_arg, Dword, MaskedEq(bit), bit)?;
            match flags_arg {
                None => rules.push(rule(vec![mode])?),
                Some(f) => {
                    for create in [libc::O_CREAT as u64, O_TMPFILE_BIT] {
                        let flags = cond(f, Dword, MaskedEq(create), create)?;
                        rules.push(rule(vec![flags, mode.clone()])?);
                    }
                }
            }
        }
        Ok(rules)
    };
    if chmod {
        deny.insert(libc::SYS_fchmod, special(1, None)?);
        deny.insert(libc::SYS_fchmodat, special(2, None)?);
        deny.insert(SYS_FCHMODAT2, special(2, None)?);
        #[cfg(target_arch = "x86_64")]
        deny.insert(libc::SYS_chmod, special(1, None)?);
    }
    deny.insert(libc::SYS_openat, special(3, Some(2))?);
    deny.insert(libc::SYS_mknodat, special(2, None)?);
    #[cfg(target_arch = "x86_64")]
    {
        deny.insert(libc::SYS_open, special(2, Some(1))?);
        deny.insert(libc::SYS_creat, special(1, None)?);
        deny.insert(libc::SYS_mknod, special(1, None)?);
    }
    Ok(())
}

/// Refuses `mknod` of character and block devices (FIFOs and sockets
/// stay): a device node the guest made in the workspace would be the
/// host's device to any host user who may open it.
fn deny_device_nodes(deny: &mut BTreeMap<i64, Vec<SeccompRule>>) -> Result<()> {
    use SeccompCmpArgLen::Dword;
    use SeccompCmpOp::MaskedEq;
    let kinds = |mode_arg: u8| -> Result<Vec<SeccompRule>> {
        [libc::S_IFCHR, libc::S_IFBLK]
            .into_iter()
            .map(|kind| {
                rule(vec![cond(
                    mode_arg,
                    Dword,
                    MaskedEq(libc::S_IFMT as u64),
                    kind as u64,
                )?])
            })
            .collect()
    };
    deny.entry(libc::SYS_mknodat).or_default().extend(kinds(2)?);
    #[cfg(target_arch = "x86_64")]
    deny.entry(libc::SYS_mknod).or_default().extend(kinds(1)?);
    Ok(())
}

/// A Landlock ruleset for a microVM's QEMU, created here and enforced in
/// the child between fork and exec (see `microvm::spawn_qemu`): QEMU reads
/// only beneath `read`, reads and writes only beneath `write`, makes no TCP
/// connection, and can neither signal nor reach the abstract sockets of
/// processes outside it. A QEMU taken over by its guest then holds no more
/// of the host than the guest was given. `None` when the kernel has no
/// Landlock. Paths that do not exist are left out.
pub(crate) fn vmm_ruleset(
    read: &[std::path::PathBuf],
    write: &[std::path::PathBuf],
) -> Result<Option<std::os::fd::OwnedFd>> {
    let err = |e: landlock::RulesetError| SetupError {
        what: format!("landlock for QEMU: {e}"),
        errno: 0,
    };
    let abi = ABI::V6;
    let existing = |paths: &[std::path::PathBuf]| -> Vec<std::path::PathBuf> {
        paths.iter().filter(|p| p.exists()).cloned().collect()
    };
    let ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(err)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(existing(read), AccessFs::from_read(abi)))
        .map_err(err)?
        .add_rules(path_beneath_rules(existing(write), AccessFs::from_all(abi)))
        .map_err(err)?;
    Ok(ruleset.into())
}

/// The filter a microVM's QEMU and its share servers (virtiofsd) run
/// under. They write the guest's files on the host with their own identity,
/// so the guest's root could otherwise chown them, leave setuid files in
/// the workspace or make device nodes there (QEMU 10's 9p server makes
/// them as root does): those calls fail (EPERM), and `openat2`, whose mode
/// a filter cannot read, reports ENOSYS so that callers fall back to
/// `openat`. Nor may they open a file by its handle, which no path rule
/// bounds.
pub(crate) fn host_file_guard() -> Result<Vec<BpfProgram>> {
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    deny_setid_modes(&mut deny, true)?;
    deny_device_nodes(&mut deny)?;
    deny.insert(libc::SYS_open_by_handle_at, vec![]);
    for nr in [libc::SYS_fchown, libc::SYS_fchownat] {
        deny.insert(nr, vec![]);
    }
    // A QEMU taken over by its guest must not lift the covers over hidden
    // workspace files (microvm/cover.rs), nor mount anything else.
    for nr in [
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_pivot_root,
        libc::SYS_unshare,
        libc::SYS_setns,
    ] {
        deny.insert(nr, vec![]);
    }
    #[cfg(target_arch = "x86_64")]
    for nr in [libc::SYS_chown, libc::SYS_lchown] {
        deny.insert(nr, vec![]);
    }
    let mut main = compile(deny, libc::EPERM)?;
    prepend_x32_guard(&mut main);
    let openat2 = compile(
        [(libc::SYS_openat2, vec![])].into_iter().collect(),
        libc::ENOSYS,
    )?;
    Ok(vec![main, openat2])
}

/// On x86_64 the x32 ABI reaches the same kernel entry points with syscall
/// numbers offset by 0x4000_0000, which a deny list by number would miss.
/// Refuse every x32 call before the generated filter runs.
fn prepend_x32_guard(prog: &mut BpfProgram) {
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    let guard = [
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // nr >= 0x4000_0000 ? fall through to the errno : skip it.
        sock_filter {
            code: BPF_JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: 0x0005_0000 | libc::ENOSYS as u32,
        },
    ];
    // The generated program validates the architecture and reloads the
    // syscall number itself, so it may follow unchanged.
    prog.splice(0..0, guard);
}
