//! Density: many idle sessions open at once, and the host memory they hold.
//!
//! Three views, since none is complete on its own:
//! - the proportional set size (Pss) of every supervisor process, which are
//!   the bench process's descendants (user-space memory only);
//! - the drop in the host's MemAvailable, which also counts kernel memory
//!   for namespaces, mounts, page tables and kernel stacks, but also
//!   whatever else the host did meanwhile;
//! - the sessions' memory cgroups, when limits are cgroups.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_bench::procfs::{Rollup, descendants, median, mib};
use cordon_sandbox::{ExecRequest, Sandbox, SandboxConfig};

use crate::Args;
use crate::stats::{Json, MIB};

const GOAL_BYTES: f64 = 300.0 * MIB;

/// Selected /proc/meminfo fields, in bytes.
#[derive(Debug, Clone, Default)]
struct Meminfo(HashMap<String, f64>);

const MEMINFO_KEYS: &[&str] = &[
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "Shmem",
    "AnonPages",
    "Slab",
    "SReclaimable",
    "SUnreclaim",
    "KernelStack",
    "PageTables",
    "Percpu",
];

/// Meminfo fields that only grow with allocations nothing can reclaim.
const PINNED: &[&str] = &[
    "AnonPages",
    "SUnreclaim",
    "PageTables",
    "KernelStack",
    "Shmem",
    "Percpu",
];

impl Meminfo {
    fn read() -> Meminfo {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Meminfo(
            text.lines()
                .filter_map(|l| {
                    let (k, rest) = l.split_once(':')?;
                    let kb: f64 = rest.split_whitespace().next()?.parse().ok()?;
                    Some((k.to_string(), kb * 1024.0))
                })
                .collect(),
        )
    }

    fn get(&self, k: &str) -> f64 {
        self.0.get(k).copied().unwrap_or(f64::NAN)
    }

    /// `free`'s classic "used": neither free nor cache.
    fn used(&self) -> f64 {
        self.get("MemTotal")
            - self.get("MemFree")
            - self.get("Buffers")
            - self.get("Cached")
            - self.get("SReclaimable")
    }

    /// The field-wise median of several samples, to damp a noisy host.
    async fn sample(n: usize, gap: Duration) -> Meminfo {
        let mut samples = Vec::new();
        for i in 0..n {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            samples.push(Meminfo::read());
        }
        let mut out = HashMap::new();
        for k in MEMINFO_KEYS {
            let mut v: Vec<f64> = samples.iter().map(|m| m.get(k)).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            out.insert(k.to_string(), v[v.len() / 2]);
        }
        Meminfo(out)
    }
}

/// The memory cgroup directory of a process, if it has one we can read.
fn memory_cgroup(pid: i32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrls.split(',').any(|c| c == "memory") {
            return Some(Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')));
        }
    }
    // cgroup v2: the unified line, if its memory.current exists.
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    for mnt in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let dir = Path::new(mnt).join(path.trim_start_matches('/'));
        if dir.join("memory.current").exists() {
            return Some(dir);
        }
    }
    None
}

fn read_num(path: &Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// (usage, kernel usage) of a memory cgroup, v1 or v2.
fn cgroup_usage(dir: &Path) -> Option<(f64, Option<f64>)> {
    if let Some(u) = read_num(&dir.join("memory.usage_in_bytes")) {
        return Some((u, read_num(&dir.join("memory.kmem.usage_in_bytes"))));
    }
    let u = read_num(&dir.join("memory.current"))?;
    let kernel = std::fs::read_to_string(dir.join("memory.stat"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("kernel ")
                    .and_then(|v| v.trim().parse().ok())
            })
        });
    Some((u, kernel))
}

/// What one round of opening, measuring and closing `n` sessions saw.
struct Round {
    open: Duration,
    close: Duration,
    procs: usize,
    unreadable: usize,
    sup: Rollup,
    host_side: f64,
    before: Meminfo,
    after: Meminfo,
    closed: Meminfo,
    cgroups: usize,
    cg_usage: f64,
    cg_kmem: f64,
    own_cg_growth: Option<f64>,
    left: usize,
}

impl Round {
    fn avail_drop(&self) -> f64 {
        self.before.get("MemAvailable") - self.after.get("MemAvailable")
    }

    fn used_rise(&self) -> f64 {
        self.after.used() - self.before.used()
    }

    fn rise(&self, k: &str) -> f64 {
        self.after.get(k) - self.before.get(k)
    }

    /// The rise of the memory that nothing can reclaim: less disturbed by
    /// page-cache churn from other tenants than MemAvailable.
    fn pinned_rise(&self) -> f64 {
        PINNED.iter().map(|k| self.rise(k)).sum()
    }

    /// Supervisors' Pss plus what the host process grew by.
    fn user_total(&self) -> f64 {
        self.sup.pss + self.host_side.max(0.0)
    }
}

async fn round(n: usize, workspace: &Path, settle: Duration) -> Result<Round, String> {
    let me = std::process::id() as i32;
    let own_cg = memory_cgroup(me);
    tokio::time::sleep(settle).await;
    let before = Meminfo::sample(5, Duration::from_millis(200)).await;
    let self_before = Rollup::read(me).unwrap_or_default();
    let own_cg_before = own_cg.as_deref().and_then(cgroup_usage);

    let t = Instant::now();
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        match Sandbox::create(SandboxConfig::new(workspace)).await {
            Ok(s) => sessions.push(s),
            Err(e) => {
                for s in &sessions {
                    s.close().await;
                }
                return Err(format!("create session {}: {e}", i + 1));
            }
        }
    }
    let open = t.elapsed();
    // Every session is live and serving.
    for (i, s) in sessions.iter().enumerate() {
        let out = s
            .exec(ExecRequest::argv(["/bin/true"]))
            .await
            .map_err(|e| format!("exec in session {}: {e}", i + 1))?;
        if !out.status.success() {
            return Err(format!("session {}: /bin/true failed", i + 1));
        }
    }
    tokio::time::sleep(settle).await;

    let after = Meminfo::sample(5, Duration::from_millis(200)).await;
    let self_after = Rollup::read(me).unwrap_or_default();
    let procs = descendants(me);
    let mut sup = Rollup::default();
    let mut unreadable = 0;
    let mut cgroups = BTreeSet::new();
    for &p in &procs {
        match Rollup::read(p) {
            Some(r) => sup.add(r),
            None => unreadable += 1,
        }
        if let Some(cg) = memory_cgroup(p)
            && Some(&cg) != own_cg.as_ref()
        {
            cgroups.insert(cg);
        }
    }
    let (mut cg_usage, mut cg_kmem, mut cg_read) = (0.0, 0.0, 0usize);
    for cg in &cgroups {
        if let Some((u, k)) = cgroup_usage(cg) {
            cg_usage += u;
            cg_kmem += k.unwrap_or(0.0);
            cg_read += 1;
        }
    }
    let own_cg_after = own_cg.as_deref().and_then(cgroup_usage);

    let t = Instant::now();
    let mut closing = Vec::new();
    for s in sessions {
        closing.push(tokio::spawn(async move { s.close().await }));
    }
    for c in closing {
        let _ = c.await;
    }
    let close = t.elapsed();
    tokio::time::sleep(settle).await;
    let closed = Meminfo::sample(5, Duration::from_millis(200)).await;
    Ok(Round {
        open,
        close,
        procs: procs.len(),
        unreadable,
        sup,
        host_side: self_after.pss - self_before.pss,
        before,
        after,
        closed,
        cgroups: cg_read,
        cg_usage,
        cg_kmem,
        own_cg_growth: match (own_cg_before, own_cg_after) {
            (Some((b, _)), Some((a, _))) => Some(a - b),
            _ => None,
        },
        left: descendants(me).len(),
    })
}

pub async fn run(args: &Args, workspace: &Path) -> Result<Json, String> {
    let n = args.num("sessions", 100)?.max(1);
    let rounds_n = args.num("rounds", 3)?.max(1);
    let settle = Duration::from_millis(args.num("settle-ms", 3000)? as u64);

    // Warm the page cache and the runtime with one session, so that the
    // first "before" sample does not count one-off costs.
    let probe = Sandbox::create(SandboxConfig::new(workspace))
        .await
        .map_err(|e| format!("create the sandbox: {e}"))?;
    let limits = probe.info().limits.clone();
    probe.close().await;

    let mut rounds = Vec::new();
    for _ in 0..rounds_n {
        rounds.push(round(n, workspace, settle).await?);
    }
    let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let per = |b: f64| b / n as f64;
    let verdict = |b: f64| if b <= GOAL_BYTES { "MET" } else { "NOT MET" };
    let unreadable = rounds.iter().map(|r| r.unreadable).max().unwrap_or(0);
    let procs = rounds.iter().map(|r| r.procs).max().unwrap_or(0);
    let left = rounds.iter().map(|r| r.left).max().unwrap_or(0);
    let cgroups = rounds.iter().map(|r| r.cgroups).max().unwrap_or(0);
    let avail_drop = med(&|r| r.avail_drop());
    let user_total = med(&|r| r.user_total());
    let pinned = med(&|r| r.pinned_rise());

    println!("== Density: {n} idle sessions ({})", crate::whoami());
    println!("   limits: {limits}");
    println!(
        "   {rounds_n} rounds of open {n}, exec /bin/true in each, idle {} ms, measure, close all; medians over rounds",
        settle.as_millis()
    );
    println!(
        "   opened in {:.2} s ({:.1} ms each), closed in {:.2} s; {procs} supervisor processes{}",
        med(&|r| r.open.as_secs_f64()),
        med(&|r| r.open.as_secs_f64()) * 1e3 / n as f64,
        med(&|r| r.close.as_secs_f64()),
        if unreadable > 0 {
            format!(" ({unreadable} not readable by this user: Pss figures are incomplete)")
        } else {
            String::new()
        }
    );
    println!();
    println!(
        "   {:<48} {:>10} {:>12}   each round (MiB)",
        "memory", "MiB", "per session"
    );
    let row = |name: &str, f: &dyn Fn(&Round) -> f64| {
        let each: Vec<String> = rounds.iter().map(|r| mib(f(r))).collect();
        let m = med(f);
        println!(
            "   {:<48} {:>10} {:>8} KiB   {}",
            name,
            mib(m),
            format!("{:.0}", per(m) / 1024.0),
            each.join(" ")
        );
    };
    row("supervisors: sum of Pss (smaps_rollup)", &|r| r.sup.pss);
    row("  of which Pss_Anon", &|r| r.sup.pss_anon);
    row("supervisors: sum of private pages", &|r| r.sup.private);
    row("supervisors: sum of Rss (shared pages n times)", &|r| {
        r.sup.rss
    });
    row("bench process (host side): Pss growth", &|r| r.host_side);
    row("user space total (supervisors Pss + host side)", &|r| {
        r.user_total()
    });
    row("host MemAvailable drop", &|r| r.avail_drop());
    row("host 'used' rise (free(1) classic)", &|r| r.used_rise());
    row("host unreclaimable rise (sum of the 6 below)", &|r| {
        r.pinned_rise()
    });
    for k in PINNED.iter().chain(&["Slab"]) {
        row(&format!("  meminfo {k} rise"), &|r| r.rise(k));
    }
    if cgroups > 0 {
        row(
            &format!("session memory cgroups ({cgroups}): usage_in_bytes"),
            &|r| r.cg_usage,
        );
        row("  of which kernel (kmem)", &|r| r.cg_kmem);
    } else {
        println!("   session memory cgroups: none (limits are rlimits)");
    }
    if rounds.iter().all(|r| r.own_cg_growth.is_some()) {
        row("bench's own memory cgroup growth (with children)", &|r| {
            r.own_cg_growth.unwrap_or(f64::NAN)
        });
    }
    row("MemAvailable after closing, below before", &|r| {
        r.before.get("MemAvailable") - r.closed.get("MemAvailable")
    });
    println!("   processes left after closing: {left}");
    println!(
        "   goal <= 300 MiB for {n} sessions: {} by the MemAvailable drop ({} MiB); {} by unreclaimable memory ({} MiB); {} by user-space Pss ({} MiB{})",
        verdict(avail_drop),
        mib(avail_drop),
        verdict(pinned),
        mib(pinned),
        verdict(user_total),
        mib(user_total),
        if unreadable > 0 { ", incomplete" } else { "" }
    );
    println!();

    let meminfo_json = |m: &Meminfo| {
        Json::obj(
            MEMINFO_KEYS
                .iter()
                .map(|k| (k.to_string(), Json::Num(m.get(k)))),
        )
    };
    let round_json = |r: &Round| {
        Json::obj([
            ("open_s", Json::Num(r.open.as_secs_f64())),
            ("close_s", Json::Num(r.close.as_secs_f64())),
            ("supervisor_processes", Json::Num(r.procs as f64)),
            ("unreadable_processes", Json::Num(r.unreadable as f64)),
            ("supervisors_pss_bytes", Json::Num(r.sup.pss)),
            ("supervisors_pss_anon_bytes", Json::Num(r.sup.pss_anon)),
            ("supervisors_rss_bytes", Json::Num(r.sup.rss)),
            ("supervisors_private_bytes", Json::Num(r.sup.private)),
            ("host_side_pss_growth_bytes", Json::Num(r.host_side)),
            ("user_space_total_bytes", Json::Num(r.user_total())),
            ("memavailable_drop_bytes", Json::Num(r.avail_drop())),
            ("used_rise_bytes", Json::Num(r.used_rise())),
            ("unreclaimable_rise_bytes", Json::Num(r.pinned_rise())),
            ("cgroups_read", Json::Num(r.cgroups as f64)),
            (
                "cgroups_usage_bytes",
                if r.cgroups > 0 {
                    Json::Num(r.cg_usage)
                } else {
                    Json::Null
                },
            ),
            (
                "cgroups_kmem_bytes",
                if r.cgroups > 0 {
                    Json::Num(r.cg_kmem)
                } else {
                    Json::Null
                },
            ),
            (
                "own_cgroup_growth_bytes",
                r.own_cg_growth.map_or(Json::Null, Json::Num),
            ),
            ("meminfo_before", meminfo_json(&r.before)),
            ("meminfo_open", meminfo_json(&r.after)),
            ("meminfo_closed", meminfo_json(&r.closed)),
            ("processes_left", Json::Num(r.left as f64)),
        ])
    };
    Ok(Json::obj([
        ("sessions", Json::Num(n as f64)),
        ("limits", Json::str(limits)),
        ("settle_ms", Json::Num(settle.as_millis() as f64)),
        ("median_memavailable_drop_bytes", Json::Num(avail_drop)),
        ("median_unreclaimable_rise_bytes", Json::Num(pinned)),
        ("median_user_space_total_bytes", Json::Num(user_total)),
        (
            "median_cgroups_usage_bytes",
            if cgroups > 0 {
                Json::Num(med(&|r| r.cg_usage))
            } else {
                Json::Null
            },
        ),
        ("pss_complete", Json::Bool(unreadable == 0)),
        ("goal_bytes", Json::Num(GOAL_BYTES)),
        (
            "goal_met_memavailable",
            Json::Bool(avail_drop <= GOAL_BYTES),
        ),
        ("goal_met_unreclaimable", Json::Bool(pinned <= GOAL_BYTES)),
        ("goal_met_pss", Json::Bool(user_total <= GOAL_BYTES)),
        ("rounds", Json::Arr(rounds.iter().map(round_json).collect())),
    ]))
}
