//! Checkpoint cost per turn (issue 20): cordon's checkpoints next to git's
//! own snapshot of the same tree, `git add -A && git commit`, in the same
//! run, on two copies of one workspace that get the same edits each turn.
//!
//! The workspace holds `--files` source-sized files in directories of 100,
//! and an ignored build directory that both leave out. Each turn rewrites
//! `--changed` files and adds one; the first record of each (a cold read
//! of every file) is reported apart. The two take turns going first, so
//! that a cache warmed by one helps the other as often.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cordon_git::Checkpoints;

use crate::Args;
use crate::stats::{Json, Summary, ms};

fn fill(root: &Path, files: usize) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    for i in 0..files {
        let dir = root.join(format!("src/m{:03}", i / 100));
        std::fs::create_dir_all(&dir).map_err(io)?;
        // About 2 KiB, like a source file.
        let body = format!(
            "// file {i}\n{}",
            "let x = 1; // padding padding\n".repeat(64)
        );
        std::fs::write(dir.join(format!("f{i}.rs")), body).map_err(io)?;
    }
    std::fs::create_dir_all(root.join("target/debug")).map_err(io)?;
    for i in 0..1000 {
        std::fs::write(root.join(format!("target/debug/o{i}.o")), [0u8; 4096]).map_err(io)?;
    }
    std::fs::write(root.join(".gitignore"), "/target/\n").map_err(io)
}

fn edit(root: &Path, turn: usize, changed: usize, files: usize) -> Result<(), String> {
    for k in 0..changed {
        let i = (turn * 7919 + k * 104_729) % files;
        let path = root.join(format!("src/m{:03}/f{i}.rs", i / 100));
        std::fs::write(path, format!("// turn {turn} edit {k}\n")).map_err(|e| e.to_string())?;
    }
    std::fs::write(root.join(format!("src/new{turn}.rs")), "fn new() {}\n")
        .map_err(|e| e.to_string())
}

fn git(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "-c",
            "gc.auto=0",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn git_snapshot(dir: &Path, turn: usize) -> Result<Duration, String> {
    let t = Instant::now();
    git(dir, &["add", "-A"])?;
    git(
        dir,
        &[
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            &format!("turn {turn}"),
        ],
    )?;
    Ok(t.elapsed())
}

pub fn run(args: &Args, tmp: &Path) -> Result<Json, String> {
    let files = args.num("files", 10_000)?;
    let turns = args.num("turns", 40)?;
    let changed = args.num("changed", 10)?;
    let ours = tmp.join("cordon-ws");
    let peer = tmp.join("git-ws");
    for d in [&ours, &peer] {
        fill(d, files)?;
    }
    git(&peer, &["init", "-q"])?;
    let store = Checkpoints::open(&tmp.join("session.checkpoints")).map_err(|e| e.to_string())?;

    let t = Instant::now();
    let first = store.record(&ours, "turn 0").map_err(|e| e.to_string())?;
    let cold_ours = t.elapsed();
    let cold_peer = git_snapshot(&peer, 0)?;
    if first.files != files + 1 {
        return Err(format!(
            "the first checkpoint kept {} files, not {}",
            first.files,
            files + 1
        ));
    }

    let (mut a, mut b) = (Vec::new(), Vec::new());
    for turn in 1..=turns {
        edit(&ours, turn, changed, files)?;
        edit(&peer, turn, changed, files)?;
        let one = || -> Result<Duration, String> {
            let t = Instant::now();
            let c = store
                .record(&ours, &format!("turn {turn}"))
                .map_err(|e| e.to_string())?;
            if !c.changed {
                return Err(format!("turn {turn}: the checkpoint saw no change"));
            }
            Ok(t.elapsed())
        };
        if turn % 2 == 0 {
            a.push(one()?);
            b.push(git_snapshot(&peer, turn)?);
        } else {
            b.push(git_snapshot(&peer, turn)?);
            a.push(one()?);
        }
    }
    // A rewind of one turn, and back (each records the files first).
    let latest = store.latest().ok_or("no checkpoint")?;
    let mut rewinds = Vec::new();
    let ids: Vec<String> = vec![first.id.clone(), latest];
    for i in 0..10 {
        let t = Instant::now();
        store
            .restore(&ours, &ids[i % 2])
            .map_err(|e| e.to_string())?;
        rewinds.push(t.elapsed());
    }

    let (sa, sb) = (Summary::of(&a), Summary::of(&b));
    let (cold_a, cold_b) = (cold_ours.as_secs_f64() * 1e6, cold_peer.as_secs_f64() * 1e6);
    let rw = Summary::of(&rewinds);
    eprintln!(
        "checkpoint of {files} files, {changed} changed + 1 new per turn, {turns} turns:\n  \
         per turn p50: cordon {} ms vs git add -A && git commit {} ms ({:.2}x)\n  \
         per turn p90: cordon {} ms vs git {} ms\n  \
         first (cold): cordon {} ms vs git {} ms ({:.2}x)\n  \
         rewind to turn 0 and back (every file of {} turns), p50: {} ms",
        ms(sa.p50),
        ms(sb.p50),
        sa.p50 / sb.p50,
        ms(sa.p90),
        ms(sb.p90),
        ms(cold_a),
        ms(cold_b),
        cold_a / cold_b,
        turns,
        ms(rw.p50),
    );
    Ok(Json::obj([
        ("files", Json::Num(files as f64)),
        ("changed_per_turn", Json::Num(changed as f64 + 1.0)),
        ("turns", Json::Num(turns as f64)),
        ("cordon_per_turn", sa.json()),
        ("git_per_turn", sb.json()),
        ("ratio_p50", Json::Num(sa.p50 / sb.p50)),
        ("cordon_first_us", Json::Num(cold_a)),
        ("git_first_us", Json::Num(cold_b)),
        ("rewind", rw.json()),
    ]))
}
