//! A throwaway PostgreSQL server for tests.
//!
//! `TestPostgres::start()` hands out a fresh, empty database on a cluster
//! that is started once per test process (initdb into a temporary
//! directory, then `postgres` with durability turned off) and shared by
//! every test in it. Dropping a `TestPostgres` drops its database; the
//! cluster is stopped and its directory removed when the process exits:
//! by an `atexit` hook on a normal exit, and by a small watcher shell (which
//! wakes when the pipe from this process closes) on any other, a crash or
//! SIGKILL included. `TestPostgres::dedicated()` gives a test a cluster of
//! its own, stopped and removed on drop.
//!
//! PostgreSQL refuses to run as root, so as root the cluster belongs to the
//! `postgres` system user (made by Debian's `postgresql` package), or
//! `nobody` without one. Authentication is `trust`, on a Unix socket in the
//! cluster's directory and on 127.0.0.1 at a free port; the superuser is
//! called `postgres`.
//!
//! The server binaries are looked for in `/usr/lib/postgresql/*/bin`
//! (newest version first), then on `PATH`. Without them `start()` panics
//! naming the package to install; `try_start()` returns `None` instead so a
//! test may skip, unless `CI` is set, when it panics too.
//!
//! Only the standard library and `libc` are used, so this file can be
//! copied into any crate's test support.

#![allow(dead_code)]

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The Debian package that provides the server binaries.
pub const PACKAGE: &str = "postgresql";

/// How long a starting server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh, empty database; dropped (with any sessions still on it) when
/// this is dropped.
pub struct TestPostgres {
    cluster: Owner,
    database: String,
}

enum Owner {
    Shared(&'static Cluster),
    Own(Box<Cluster>),
}

impl TestPostgres {
    /// Whether the PostgreSQL server binaries are installed.
    pub fn available() -> bool {
        find_bindir().is_some()
    }

    /// A new database on the process's shared cluster, which is started on
    /// first use. Panics if PostgreSQL is not installed or will not start.
    pub fn start() -> TestPostgres {
        let Some(bindir) = find_bindir() else {
            panic!("{}", missing_message())
        };
        let cluster = shared_cluster(bindir);
        let database = cluster.create_database();
        TestPostgres {
            cluster: Owner::Shared(cluster),
            database,
        }
    }

    /// Like `start()`, but `None` when PostgreSQL is not installed and `CI`
    /// is not set, so that the caller can skip its test.
    pub fn try_start() -> Option<TestPostgres> {
        if find_bindir().is_none() {
            if in_ci() {
                panic!(
                    "{} (CI is set, so this test may not be skipped)",
                    missing_message()
                );
            }
            eprintln!("skipping: {}", missing_message());
            return None;
        }
        Some(TestPostgres::start())
    }

    /// A database on a cluster of its own (about half a second more than
    /// `start()`), for a test that must stop, restart or reconfigure the
    /// server. The cluster is stopped and removed when this is dropped.
    pub fn dedicated() -> TestPostgres {
        let Some(bindir) = find_bindir() else {
            panic!("{}", missing_message())
        };
        let cluster = Cluster::start(&bindir).unwrap_or_else(|e| panic!("{e}"));
        let database = cluster.create_database();
        TestPostgres {
            cluster: Owner::Own(Box::new(cluster)),
            database,
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.cluster().port,
            self.database
        )
    }

    /// The same database over the Unix socket (no TCP):
    /// `postgres://postgres@localhost:PORT/DATABASE?host=SOCKET_DIR`.
    pub fn socket_url(&self) -> String {
        format!(
            "postgres://postgres@localhost:{}/{}?host={}",
            self.cluster().port,
            self.database,
            self.cluster().dir.display()
        )
    }

    pub fn database(&self) -> &str {
        &self.database
    }

    pub fn port(&self) -> u16 {
        self.cluster().port
    }

    /// The server's log file, for a test's failure message.
    pub fn log_path(&self) -> PathBuf {
        self.cluster().log_path()
    }

    /// Runs one SQL statement as the superuser on this database, outside
    /// any client library (e.g. to break the database under a test).
    pub fn execute(&self, sql: &str) -> Result<(), String> {
        self.cluster()
            .query(&self.database, sql)
            .map_err(|e| e.to_string())
    }

    fn cluster(&self) -> &Cluster {
        match &self.cluster {
            Owner::Shared(c) => c,
            Owner::Own(c) => c,
        }
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        // A dedicated cluster goes away whole; on the shared one, free the
        // disk space now rather than at exit. A failure here is harmless.
        // WITH (FORCE) ends the sessions of a pool that is still open.
        if let Owner::Shared(c) = &self.cluster {
            let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.database);
            if let Err(e) = c.query("postgres", &sql) {
                eprintln!("pgtest: {sql}: {e}");
            }
        }
    }
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn missing_message() -> String {
    format!(
        "PostgreSQL server binaries (initdb, postgres) not found in \
         /usr/lib/postgresql/*/bin or on PATH: install the Debian package `{PACKAGE}`"
    )
}

/// The newest `/usr/lib/postgresql/N/bin` with both `initdb` and `postgres`,
/// else the directory on `PATH` that has them.
fn find_bindir() -> Option<PathBuf> {
    static BINDIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    BINDIR
        .get_or_init(|| {
            let usable = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
            let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let version = e.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((version, e.path().join("bin")))
                })
                .filter(|(_, d)| usable(d))
                .collect();
            versions.sort();
            if let Some((_, d)) = versions.pop() {
                return Some(d);
            }
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path).find(|d| usable(d))
        })
        .clone()
}

fn shared_cluster(bindir: PathBuf) -> &'static Cluster {
    static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let cluster = SHARED.get_or_init(|| {
        let cluster = Cluster::start(&bindir)?;
        // Statics are never dropped: stop the server when the process exits.
        extern "C" fn stop_shared() {
            if let Some(Ok(c)) = SHARED.get() {
                c.stop();
            }
        }
        // SAFETY: registers a plain function with no preconditions.
        unsafe { libc::atexit(stop_shared) };
        Ok(cluster)
    });
    match cluster {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// One running server in its own temporary directory.
struct Cluster {
    /// Holds `data/`, the log, and the Unix socket.
    dir: PathBuf,
    port: u16,
    postmaster: Mutex<Option<Child>>,
    /// The watcher's stdin: when it closes, however this process ends, the
    /// watcher stops the server and removes `dir`.
    watcher: Mutex<Option<(Child, ChildStdin)>>,
    databases: AtomicU64,
}

impl Cluster {
    fn start(bindir: &Path) -> Result<Cluster, String> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let owner = RunAs::pick()?;
        let dir = std::env::temp_dir().join(format!(
            "pgtest-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("pgtest: creating {}: {e}", dir.display()))?;
        if let Some((uid, gid)) = owner.ids {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("pgtest: chown {} to {}: {e}", dir.display(), owner.name))?;
        }
        // Started before anything else so that nothing outlives a crash.
        let watcher = spawn_watcher(&dir)
            .map_err(|e| format!("pgtest: starting the cleanup watcher: {e}"))?;
        let mut cluster = Cluster {
            dir,
            port: 0,
            postmaster: Mutex::new(None),
            watcher: Mutex::new(Some(watcher)),
            databases: AtomicU64::new(0),
        };
        if let Err(e) = cluster.initdb(bindir, &owner) {
            return Err(cluster.abandon(e));
        }
        // The free port may be taken between our probe and the server's
        // bind: try a few.
        let mut attempts = 0;
        loop {
            attempts += 1;
            cluster.port = match free_port() {
                Ok(port) => port,
                Err(e) => return Err(cluster.abandon(format!("pgtest: finding a free port: {e}"))),
            };
            match cluster.run(bindir, &owner) {
                Ok(()) => return Ok(cluster),
                Err(e) => {
                    let log = fs::read_to_string(cluster.log_path()).unwrap_or_default();
                    if attempts == 5 || !log.contains("could not bind") {
                        return Err(cluster.abandon(e));
                    }
                }
            }
        }
    }

    /// After a failed start: stops everything but keeps the directory for
    /// inspection, and returns `error` with the end of the server's log.
    fn abandon(self, error: String) -> String {
        if let Some((mut watcher, _stdin)) = self.watcher.lock().unwrap().take() {
            let _ = watcher.kill(); // before it sees EOF and removes the directory
            let _ = watcher.wait();
        }
        if let Some(mut child) = self.postmaster.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        std::mem::forget(self); // keep the directory
        format!("{error}\n--- last lines of the log ---\n{tail}")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn command(&self, program: PathBuf, owner: &RunAs) -> Result<Command, String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("pgtest: opening {}: {e}", self.log_path().display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("pgtest: log file: {e}"))?;
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.dir)
            .env("TZ", "UTC") // spares initdb its time-zone probe
            .env("LC_ALL", "C")
            .env_remove("PGDATA")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            // Out of the terminal's process group: Ctrl-C is for the tests.
            .process_group(0);
        if let Some((uid, gid)) = owner.ids {
            // std drops the supplementary groups when it changes the uid.
            cmd.uid(uid).gid(gid);
            cmd.env("HOME", &self.dir).env("USER", &owner.name);
        }
        Ok(cmd)
    }

    fn initdb(&self, bindir: &Path, owner: &RunAs) -> Result<(), String> {
        let status = self
            .command(bindir.join("initdb"), owner)?
            .args(["-D", "data", "-U", "postgres", "-A", "trust", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync", "--no-instructions"])
            .status()
            .map_err(|e| spawn_error("initdb", &self.dir, owner, e))?;
        if !status.success() {
            return Err(format!(
                "pgtest: initdb failed ({status}); see {}",
                self.log_path().display()
            ));
        }
        Ok(())
    }

    /// Starts the server on `self.port` and waits until it accepts
    /// connections.
    fn run(&self, bindir: &Path, owner: &RunAs) -> Result<(), String> {
        let port = self.port.to_string();
        let socket_dir = self.dir.to_str().ok_or("pgtest: temp dir is not UTF-8")?;
        let mut child = self
            .command(bindir.join("postgres"), owner)?
            .args(["-D", "data", "-p", &port, "-k", socket_dir])
            .args(["-c", "listen_addresses=127.0.0.1"])
            // Throwaway data: no durability, little memory.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off", "-c", "wal_level=minimal"])
            .args(["-c", "max_wal_senders=0", "-c", "shared_buffers=16MB"])
            .args(["-c", "max_connections=200", "-c", "logging_collector=off"])
            .spawn()
            .map_err(|e| spawn_error("postgres", &self.dir, owner, e))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "pgtest: postgres exited during start-up ({status}); see {}",
                    self.log_path().display()
                ));
            }
            match self.query("postgres", "SELECT 1") {
                Ok(()) => break,
                Err(e) if started.elapsed() > READY_TIMEOUT => {
                    // SAFETY: signals our own child, which has not been reaped.
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
                    let _ = child.wait();
                    return Err(format!(
                        "pgtest: postgres did not accept connections within {READY_TIMEOUT:?} \
                         ({e}); see {}",
                        self.log_path().display()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        *self.postmaster.lock().unwrap() = Some(child);
        Ok(())
    }

    fn create_database(&self) -> String {
        let name = format!("test_{}", self.databases.fetch_add(1, Ordering::Relaxed));
        // An empty template0 copy; FILE_COPY is quicker than the default
        // WAL_LOG for a small template when nothing is fsynced.
        let sql = format!("CREATE DATABASE \"{name}\" TEMPLATE template0 STRATEGY FILE_COPY");
        if let Err(e) = self.query("postgres", &sql) {
            panic!("pgtest: {sql}: {e}; see {}", self.log_path().display());
        }
        name
    }

    /// Runs `sql` on `database` over the Unix socket.
    fn query(&self, database: &str, sql: &str) -> Result<(), WireError> {
        let socket = self.dir.join(format!(".s.PGSQL.{}", self.port));
        simple_query(&socket, database, sql)
    }

    /// Immediate shutdown (no checkpoint: the data is thrown away), then
    /// removes the directory. Idempotent.
    fn stop(&self) {
        if let Some(mut child) = self.postmaster.lock().unwrap().take() {
            // SIGQUIT: the postmaster kills its backends, waits for them,
            // and exits; so once it is reaped no postgres process is left.
            // SAFETY: signals our own child, which has not been reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
        if let Some((mut watcher, stdin)) = self.watcher.lock().unwrap().take() {
            drop(stdin); // it finds nothing left to do, and exits
            let _ = watcher.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Who runs the server: the current user, or as root `postgres`/`nobody`.
struct RunAs {
    name: String,
    ids: Option<(u32, u32)>,
}

impl RunAs {
    fn pick() -> Result<RunAs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(RunAs {
                name: String::new(),
                ids: None,
            });
        }
        for name in ["postgres", "nobody"] {
            if let Some(ids) = user_ids(name) {
                return Ok(RunAs {
                    name: name.to_owned(),
                    ids: Some(ids),
                });
            }
        }
        Err(
            "pgtest: running as root, and there is neither a `postgres` nor a `nobody` \
             user to run PostgreSQL as"
                .to_owned(),
        )
    }
}

fn user_ids(name: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: zeroed passwd is a valid out-parameter; the buffer outlives
    // the call and we copy the two integers out before it goes.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        );
        (rc == 0 && !out.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
    }
}

/// A shell that waits for EOF on its stdin (which happens when this process
/// ends, however it ends) and then stops the server named by
/// `DIR/data/postmaster.pid` and removes `DIR`. Its own process group, so a
/// Ctrl-C meant for the tests does not kill it first.
fn spawn_watcher(dir: &Path) -> io::Result<(Child, ChildStdin)> {
    const SCRIPT: &str = r#"
        while read -r _; do :; done
        pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
        if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
            i=0
            # postgres removes its pid file last; a zombie still answers kill -0
            while [ -e "$1/data/postmaster.pid" ] && kill -0 "$pid" 2>/dev/null &&
                [ "$i" -lt 200 ]; do
                sleep 0.05; i=$((i + 1))
            done
        fi
        rm -rf "$1"
    "#;
    let mut child = Command::new("/bin/sh")
        .args(["-c", SCRIPT, "pgtest-watcher"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let stdin = child.stdin.take().expect("piped stdin");
    Ok((child, stdin))
}

fn spawn_error(program: &str, dir: &Path, owner: &RunAs, e: io::Error) -> String {
    if owner.ids.is_some() && e.kind() == io::ErrorKind::PermissionDenied {
        format!(
            "pgtest: running {program} as `{}` in {}: {e}; that user must be able to reach \
             the directory: point TMPDIR at one it can (such as /tmp)",
            owner.name,
            dir.display()
        )
    } else {
        format!("pgtest: running {program}: {e}")
    }
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Why a statement over the wire failed.
#[derive(Debug)]
enum WireError {
    Io(io::Error),
    /// An ErrorResponse: SQLSTATE and message.
    Server(String, String),
    Protocol(String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Io(e) => write!(f, "{e}"),
            WireError::Server(code, msg) => write!(f, "{msg} (SQLSTATE {code})"),
            WireError::Protocol(msg) => write!(f, "protocol: {msg}"),
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        WireError::Io(e)
    }
}

/// The smallest PostgreSQL client that can do what the harness needs: log
/// in as `postgres` with trust authentication, run one statement with the
/// simple-query protocol, and log out.
fn simple_query(socket: &Path, database: &str, sql: &str) -> Result<(), WireError> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;

    let mut body = 196608i32.to_be_bytes().to_vec(); // protocol 3.0
    for part in ["user", "postgres", "database", database, ""] {
        body.extend_from_slice(part.as_bytes());
        body.push(0);
    }
    let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    s.write_all(&msg)?;
    let mut failure = None;
    read_until_ready(&mut s, &mut failure)?;
    if let Some(e) = failure {
        return Err(e);
    }

    let mut msg = vec![b'Q'];
    msg.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    msg.extend_from_slice(sql.as_bytes());
    msg.push(0);
    s.write_all(&msg)?;
    read_until_ready(&mut s, &mut failure)?;
    let _ = s.write_all(&[b'X', 0, 0, 0, 4]);
    failure.map_or(Ok(()), Err)
}

/// Reads messages up to ReadyForQuery, keeping the first ErrorResponse in
/// `failure`. An error during log-in ends the connection instead, so EOF
/// after one is not an I/O error.
fn read_until_ready(s: &mut UnixStream, failure: &mut Option<WireError>) -> Result<(), WireError> {
    loop {
        let mut head = [0u8; 5];
        if let Err(e) = s.read_exact(&mut head) {
            return match failure.take() {
                Some(f) if e.kind() == io::ErrorKind::UnexpectedEof => Err(f),
                _ => Err(e.into()),
            };
        }
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        if !(4..=1 << 24).contains(&len) {
            return Err(WireError::Protocol(format!("message length {len}")));
        }
        let mut body = vec![0u8; len as usize - 4];
        s.read_exact(&mut body)?;
        match head[0] {
            b'Z' => return Ok(()),
            b'R' if body.get(..4) != Some(&[0, 0, 0, 0]) => {
                return Err(WireError::Protocol(
                    "the server asked for a password; expected trust authentication".into(),
                ));
            }
            b'E' if failure.is_none() => {
                let (mut code, mut message) = (String::new(), String::new());
                for field in body.split(|&b| b == 0) {
                    match field.split_first() {
                        Some((b'C', v)) => code = String::from_utf8_lossy(v).into_owned(),
                        Some((b'M', v)) => message = String::from_utf8_lossy(v).into_owned(),
                        _ => {}
                    }
                }
                *failure = Some(WireError::Server(code, message));
            }
            _ => {} // ParameterStatus, BackendKeyData, notices, results
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn databases_are_fresh_and_distinct() {
        let Some(a) = TestPostgres::try_start() else {
            return;
        };
        let b = TestPostgres::start();
        assert_ne!(a.url(), b.url());
        a.execute("CREATE TABLE t (x int)").unwrap();
        // b is another database: the name is free there.
        b.execute("CREATE TABLE t (x int)").unwrap();
        let err = a.execute("CREATE TABLE t (x int)").unwrap_err();
        assert!(err.contains("42P07"), "{err}");
        // Dropping a TestPostgres drops its database, sessions and all.
        let name = a.database().to_owned();
        drop(a);
        b.execute(&format!("CREATE DATABASE \"{name}\"")).unwrap();
        b.execute(&format!("DROP DATABASE \"{name}\"")).unwrap();
    }

    #[test]
    fn dedicated_cluster_is_removed_on_drop() {
        if !TestPostgres::available() {
            assert!(!in_ci(), "{}", missing_message());
            return;
        }
        let pg = TestPostgres::dedicated();
        let dir = pg.cluster().dir.clone();
        let pid = pg
            .cluster()
            .postmaster
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .id();
        pg.execute("SELECT 1").unwrap();
        drop(pg);
        assert!(!dir.exists(), "{} is left behind", dir.display());
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive, "postmaster {pid} still running");
    }
}
