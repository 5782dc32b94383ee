"""The stock E2B Python SDK (from PyPI) against `cordon serve`.

Run by crates/server/tests/suite/e2b.rs with E2B_API_KEY, E2B_API_URL and
E2B_SANDBOX_URL set; each check prints `ok NAME`, and any failure raises.
"""

import sys
import time

from e2b import CommandExitException, Sandbox, TimeoutException
from e2b.sandbox.sandbox_api import SandboxQuery


def ok(name):
    print("ok", name, flush=True)


tag = f"t{int(time.time() * 1000)}"
sbx = Sandbox.create(metadata={"suite": tag}, envs={"FROM_CREATE": "yes"}, timeout=120)
assert sbx.sandbox_id.startswith("sbx-"), sbx.sandbox_id
assert sbx.is_running()
ok("create")

r = sbx.commands.run("echo hello; pwd; whoami; echo $HOME $FROM_CREATE")
assert r.exit_code == 0, r
assert r.stdout == "hello\n/home/user\nuser\n/home/user yes\n", repr(r.stdout)
ok("run")

r = sbx.commands.run("echo $A-$B; pwd", envs={"A": "1", "B": "two words"}, cwd="/tmp")
assert r.stdout == "1-two words\n/tmp\n", repr(r.stdout)
r = sbx.commands.run("pwd", cwd="sub/..")
assert r.stdout == "/home/user\n", repr(r.stdout)
ok("envs and cwd")

r = sbx.commands.run("id -u; pwd; echo $HOME; touch /etc/root-was-here", user="root")
assert r.stdout == "0\n/root\n/root\n", repr(r.stdout)
r = sbx.commands.run("id -un; ls -l /etc/root-was-here | cut -d' ' -f3", user="user")
assert r.stdout == "user\nroot\n", repr(r.stdout)
try:
    sbx.commands.run("true", user="nobody-here")
    raise AssertionError("an unknown user ran a command")
except Exception as e:
    assert "does not exist" in str(e), e
ok("users")

info = sbx.files.write("dir/a.txt", "hello")
assert info.path == "/home/user/dir/a.txt", info
assert sbx.files.read("dir/a.txt") == "hello"
r = sbx.commands.run("stat -c '%U %a' dir/a.txt dir")
assert r.stdout == "user 644\nuser 755\n", repr(r.stdout)
many = sbx.files.write_files([{"path": "x/1.txt", "data": "one"}, {"path": "/tmp/2.bin", "data": b"\x00\xff"}])
assert [w.path for w in many] == ["/home/user/x/1.txt", "/tmp/2.bin"], many
assert bytes(sbx.files.read("/tmp/2.bin", format="bytes")) == b"\x00\xff"
big = bytes(range(256)) * 8192
sbx.files.write("big.bin", big)
assert bytes(sbx.files.read("big.bin", format="bytes")) == big
for missing, kind in [("nope", "FileNotFound"), ("dir", "InvalidArgument")]:
    try:
        sbx.files.read(missing)
        raise AssertionError(f"read {missing}")
    except Exception as e:
        assert type(e).__name__.startswith(kind), e
assert sbx.files.write("/root/only", "r", user="root").path == "/root/only"
r = sbx.commands.run("stat -c %U /root/only", user="root")
assert r.stdout == "root\n", repr(r.stdout)
import urllib.request

assert urllib.request.urlopen(sbx.download_url("dir/a.txt")).read() == b"hello"
ok("files")

assert sbx.files.make_dir("tree/sub")
assert not sbx.files.make_dir("tree/sub")
sbx.files.write("tree/a.txt", "aa")
sbx.commands.run("ln -s /home/user/tree/a.txt tree/link")
names = [e.path for e in sbx.files.list("tree", depth=2)]
assert names == ["/home/user/tree/a.txt", "/home/user/tree/link", "/home/user/tree/sub"], names
info = sbx.files.get_info("tree/link")
assert info.symlink_target == "/home/user/tree/a.txt" and info.type.value == "file", info
info = sbx.files.get_info("tree/a.txt")
assert (info.size, info.mode, info.permissions, info.owner) == (2, 0o644, "-rw-r--r--", "user"), info
assert sbx.files.exists("tree/a.txt") and not sbx.files.exists("tree/nope")
moved = sbx.files.rename("tree/a.txt", "/tmp/elsewhere/b.txt")
assert moved.path == "/tmp/elsewhere/b.txt", moved
assert sbx.files.read("/tmp/elsewhere/b.txt") == "aa"
sbx.files.remove("tree")
assert not sbx.files.exists("tree")
sbx.files.write("gz.txt", "zipped " * 1000, gzip=True)
assert sbx.files.read("gz.txt") == "zipped " * 1000
assert sbx.files.read("gz.txt", gzip=True) == "zipped " * 1000
ok("file operations")

from e2b import FilesystemEventType

sbx.files.make_dir("watched/deep")
w = sbx.files.watch_dir("watched", recursive=True)
sbx.files.write("watched/deep/new.txt", "hello")
events = [(e.name, e.type) for e in w.get_new_events()]
assert events == [
    ("deep/new.txt", FilesystemEventType.CREATE),
    ("deep/new.txt", FilesystemEventType.CHMOD),
    ("deep/new.txt", FilesystemEventType.WRITE),
], events
sbx.commands.run("rm watched/deep/new.txt")
assert [(e.name, e.type) for e in w.get_new_events()] == [("deep/new.txt", FilesystemEventType.REMOVE)]
w.stop()
ok("watch")

seen = []
r = sbx.commands.run("printf 'a\\n'; printf 'b\\n' >&2; printf '\\xff\\xfe'", on_stdout=seen.append)
assert "a\n" in "".join(seen), seen
assert r.stderr == "b\n", repr(r.stderr)
ok("on_stdout and stderr")

try:
    sbx.commands.run("echo out; exit 3")
    raise AssertionError("exit 3 raised nothing")
except CommandExitException as e:
    assert e.exit_code == 3 and e.stdout == "out\n", e
ok("exit code")

h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "first\n")
sbx.commands.send_stdin(h.pid, "")
sbx.commands.send_stdin(h.pid, b"\x00second\n")
sbx.commands.close_stdin(h.pid)
r = h.wait()
assert r.stdout == "first\n\x00second\n", repr(r.stdout)
ok("stdin")

h = sbx.commands.run("sleep 60", background=True)
listed = {p.pid: p for p in sbx.commands.list()}
assert h.pid in listed and listed[h.pid].cmd == "/bin/bash", listed
assert listed[h.pid].args[-1] == "sleep 60", listed[h.pid]
again = sbx.commands.connect(h.pid)
assert sbx.commands.kill(h.pid)
try:
    again.wait()
    raise AssertionError("a killed process ended well")
except CommandExitException as e:
    assert e.exit_code == -1 and "killed" in (e.error or ""), e
r = sbx.commands.run(f"kill -0 {h.pid} 2>/dev/null && echo alive || echo gone")
assert r.stdout == "gone\n", repr(r.stdout)
assert not sbx.commands.kill(999999)
ok("list, connect and kill")

t0 = time.time()
try:
    sbx.commands.run("sleep 10", timeout=1)
    raise AssertionError("a command ran past its timeout")
except TimeoutException:
    pass
assert time.time() - t0 < 5
ok("timeout")

found = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
assert [s.sandbox_id for s in found] == [sbx.sandbox_id], found
info = sbx.get_info()
assert info.metadata == {"suite": tag} and info.template_id, info
before = info.end_at
sbx.set_timeout(300)
assert sbx.get_info().end_at > before
ok("list, info and timeout")

same = Sandbox.connect(sbx.sandbox_id)
assert same.commands.run("echo again").stdout == "again\n"
ok("connect")

sbx.files.write("/home/user/notes.txt", "from the parent\n")
sbx.commands.run("echo kept > /workspace/kept.txt")
forks = sbx.fork(count=2, timeout=60)
assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
for i, f in enumerate(forks):
    assert f.sandbox_id != sbx.sandbox_id and f.is_running()
    r = f.commands.run("cat ~/notes.txt /workspace/kept.txt; echo $FROM_CREATE")
    assert r.stdout == "from the parent\nkept\nyes\n", repr(r.stdout)
    f.files.write("/home/user/mine.txt", str(i))
assert not sbx.files.exists("/home/user/mine.txt")
assert [f.files.read("/home/user/mine.txt") for f in forks] == ["0", "1"]
for f in forks:
    f.kill()
ok("fork")

h = sbx.commands.run("sleep 60", background=True)
sbx.kill()
try:
    h.wait()
    raise AssertionError("a command outlived its sandbox")
except TimeoutException as e:
    assert "sandbox was killed" in str(e), e
assert not sbx.is_running()
assert not Sandbox.kill(sbx.sandbox_id)
ok("killed during a run")

print("all checks passed", file=sys.stderr)
