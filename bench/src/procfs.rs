//! Process memory as /proc reports it, for the memory benchmarks.

use std::collections::HashMap;

use crate::stats::MIB;

/// Sums of /proc/PID/smaps_rollup fields, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rollup {
    pub rss: f64,
    pub pss: f64,
    pub pss_anon: f64,
    pub private: f64,
}

impl Rollup {
    pub fn read(pid: i32) -> Option<Rollup> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
        let mut r = Rollup::default();
        for l in text.lines() {
            let Some((k, rest)) = l.split_once(':') else {
                continue;
            };
            let Some(kb) = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            else {
                continue;
            };
            let b = kb * 1024.0;
            match k {
                "Rss" => r.rss += b,
                "Pss" => r.pss += b,
                "Pss_Anon" => r.pss_anon += b,
                "Private_Clean" | "Private_Dirty" => r.private += b,
                _ => {}
            }
        }
        Some(r)
    }

    pub fn add(&mut self, o: Rollup) {
        self.rss += o.rss;
        self.pss += o.pss;
        self.pss_anon += o.pss_anon;
        self.private += o.private;
    }
}

/// Every descendant of `root`, found through the parent links in /proc.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may contain spaces and parentheses.
            let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = after
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<i32>().ok())
            {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if let Some(c) = children.get(&p) {
            out.extend(c);
            stack.extend(c);
        }
    }
    out.sort_unstable();
    out
}

pub fn mib(b: f64) -> String {
    format!("{:.1}", b / MIB)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}
