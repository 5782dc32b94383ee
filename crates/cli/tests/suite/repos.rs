//! Git repositories below the workspace's top level: a clone inside the
//! project and a submodule. Git on the host reads each one's
//! configuration and hooks when the user runs it there, and `git status`
//! at the top reads each submodule's `.git` file, so a sandbox that could
//! write them would have the user's next git run its commands. Each
//! attack runs as root, unprivileged and in a microVM; the assertions are
//! on the host: what git there ran (a marker file) and what the sandbox
//! could change.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{Ctx, Out};

/// Git on the host as the workspace's owner, with nothing from the
/// environment or the system's configuration.
fn git(t: &Ctx, dir: &Path, args: &[&str]) -> Out {
    let home = format!("HOME={}", t.dir().display());
    let mut argv = vec![
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        &home,
        "GIT_CONFIG_NOSYSTEM=1",
        "git",
        "-c",
        "user.email=u@example.invalid",
        "-c",
        "user.name=u",
        "-c",
        "protocol.file.allow=always",
        "-C",
        dir.to_str().unwrap(),
    ];
    argv.extend_from_slice(args);
    let out = t.host_as_owner(&argv);
    out.code(0);
    out
}

/// A repository at the top, a clone inside it (untracked) and a submodule
/// whose `.git` is a file naming its git directory inside the top's.
fn project(t: &Ctx) {
    let source = t.outside.join("subsrc");
    std::fs::create_dir(&source).unwrap();
    std::os::unix::fs::chown(&source, Some(t.uid), Some(t.gid)).unwrap();
    git(t, &source, &["init", "-q"]);
    git(t, &source, &["commit", "-q", "--allow-empty", "-m", "sub"]);
    git(t, &t.workspace, &["init", "-q"]);
    git(t, &t.workspace.join("."), &["init", "-q", "lib"]);
    git(
        t,
        &t.workspace,
        &[
            "submodule",
            "add",
            "-q",
            source.to_str().unwrap(),
            "vendor/sub",
        ],
    );
    git(t, &t.workspace, &["commit", "-q", "-m", "base"]);
}

/// The sandbox rewrites a nested clone's configuration, moves its `.git`
/// aside, and points the submodule's `.git` file at a git directory of its
/// own: all refused, while the rest of the nested trees stay writable. Git
/// on the host then runs nothing the sandbox wrote.
fn nested_repositories_run_what_the_sandbox_wrote(t: &Ctx) {
    project(t);
    std::fs::set_permissions(&t.outside, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = t.outside.join("pwned-by-git");
    let m = marker.display();
    let out = t.sh(&format!(
        "git -C lib config core.fsmonitor 'touch {m}' 2>&1; echo lib=$?; \
         printf '[core]\\n\\tfsmonitor = touch {m}\\n' >> lib/.git/config; echo append=$?; \
         mv lib/.git lib/aside 2>&1; echo move=$?; \
         mkdir -p /tmp/evil && cp -r .git/modules/vendor/sub/. /tmp/evil/ && \
         git config --file /tmp/evil/config core.fsmonitor 'touch {m}' && \
         echo 'gitdir: /tmp/evil' > vendor/sub/.git; echo subfile=$?; \
         echo work > lib/work.txt; echo libwork=$?; \
         echo work > vendor/sub/work.txt; echo subwork=$?"
    ));
    out.code(0).line("libwork=0").line("subwork=0");
    for refused in ["lib=", "append=", "move=", "subfile="] {
        if out
            .stdout
            .lines()
            .any(|l| l.starts_with(refused) && l.ends_with("=0"))
        {
            out.fail(format_args!("{refused} succeeded in the sandbox"));
        }
    }
    // The user's git: at the top (which reads the submodule's), and in each.
    git(t, &t.workspace, &["status"]);
    git(t, &t.workspace.join("lib"), &["status"]);
    git(t, &t.workspace.join("vendor/sub"), &["status"]);
    if marker.exists() {
        out.fail("HOST CHANGED: git on the host ran a command the sandbox planted");
    }
}
attack!(nested_repositories_run_what_the_sandbox_wrote);

/// A repository the sandbox makes (where there was none, or in a new
/// directory) cannot be protected while it runs; cordon says so when the
/// sandbox ends, naming what git would run, and says nothing of a plain
/// one.
fn a_repository_made_in_the_sandbox_is_reported(t: &Ctx) {
    let out = t.sh(
        "git init -q && git config core.fsmonitor 'touch /tmp/x' && \
         git init -q plain && mkdir -p sub && git -C sub init -q && \
         printf '#!/bin/sh\\n' > sub/.git/hooks/pre-commit && echo planted",
    );
    out.code(0)
        .line("planted")
        .stderr_has("cordon: warning: the sandbox left .git in the workspace: configuration git may run commands from: core.fsmonitor")
        .stderr_has("cordon: warning: the sandbox left sub/.git in the workspace: hooks: pre-commit")
        .lacks("plain/.git");
}
attack!(a_repository_made_in_the_sandbox_is_reported);
