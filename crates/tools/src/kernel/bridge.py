# cordon's kernel bridge: runs inside the sandbox as `python -c <this>`,
# starts an ipykernel over the ipc transport (the sandbox's loopback may be
# down) and speaks JSON lines with the host: one request per stdin line,
# replies on stdout, each request ending in one "done" line.
#
# Everything here is bounded: the sandbox's code decides what the kernel
# sends, and the host must never be made to read without limit. The host
# bounds what it reads on its own as well.

import json
import os
import queue
import re
import sys
import tempfile
import time

PROTOCOL = 1
STREAM_CAP = 1 << 20  # bytes of stdout and of stderr forwarded per call
DISPLAY_CAP = 50  # display items forwarded per call
ITEM_CAP = 5 << 20  # one display item's data, in characters
DISPLAY_BYTES_CAP = 16 << 20  # all display items of one call
TRACE_CAP = 64 << 10  # a traceback, joined
NAME_CAP = 4 << 10  # ename, evalue
INTERRUPT_GRACE = 5.0  # seconds for an interrupted kernel to go idle
POLL = 0.2
PIECE = 16 << 10  # characters of output per stream line
KINDS = ("image/png", "image/jpeg", "image/svg+xml", "text/html", "text/plain")
ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")

# Our replies go to a private copy of stdout; fd 1 and 2 become /dev/null so
# that nothing else this process or its children print lands among them.
_out = os.fdopen(os.dup(1), "wb", buffering=0)
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 1)


def send(obj):
    # The leading newline ends any partial line something else in the
    # sandbox wrote to our stdout, so the host can still find ours.
    _out.write(b"\n" + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace") + b"\n")


def clean(text, cap):
    text = ANSI.sub("", text if isinstance(text, str) else str(text))
    return text[:cap]


class Call:
    def __init__(self, rid):
        self.rid = rid
        self.sent = {"stdout": 0, "stderr": 0}
        self.dropped_stream = 0
        self.items = 0
        self.item_bytes = 0
        self.dropped_items = 0
        self.count = None

    def stream(self, name, text):
        if name not in self.sent:
            return
        room = STREAM_CAP - self.sent[name]
        data = text.encode("utf-8", "replace")
        if room <= 0:
            self.dropped_stream += len(data)
            return
        keep = data[:room]
        self.dropped_stream += len(data) - len(keep)
        self.sent[name] += len(keep)
        # In pieces, so that no line gets long even if every character
        # needs an escape.
        text = keep.decode("utf-8", "ignore")
        for i in range(0, len(text), PIECE):
            send({"type": "stream", "id": self.rid, "name": name,
                  "text": text[i:i + PIECE]})

    def bundle(self, data):
        out = {}
        size = 0
        for kind in KINDS:
            value = data.get(kind)
            if isinstance(value, list):
                value = "".join(str(v) for v in value)
            if not isinstance(value, str):
                continue
            # Measured as sent: escapes can make text several times longer.
            encoded = len(json.dumps(value, ensure_ascii=False).encode())
            if encoded > ITEM_CAP:
                continue
            out[kind] = value
            size += encoded
        return out, size

    def display(self, kind, content):
        data = content.get("data") or {}
        bundle, size = self.bundle(data)
        if kind == "execute_result":
            self.count = content.get("execution_count")
        if (kind != "execute_result" and (self.items >= DISPLAY_CAP
                or self.item_bytes + size > DISPLAY_BYTES_CAP)) or not bundle:
            self.dropped_items += 1
            return
        if kind == "execute_result" and self.item_bytes + size > DISPLAY_BYTES_CAP:
            bundle = {k: v for k, v in bundle.items() if k == "text/plain"}
            size = len(bundle.get("text/plain", ""))
        self.items += 1
        self.item_bytes += size
        send({"type": "result" if kind == "execute_result" else "display",
              "id": self.rid, "data": bundle})

    def error(self, content):
        tb = [clean(line, TRACE_CAP) for line in (content.get("traceback") or [])[:200]]
        total, kept = 0, []
        for line in tb:
            total += len(line)
            if total > TRACE_CAP:
                break
            kept.append(line)
        send({"type": "error", "id": self.rid,
              "ename": clean(content.get("ename", ""), NAME_CAP),
              "evalue": clean(content.get("evalue", ""), NAME_CAP),
              "traceback": kept})

    def done(self, status):
        send({"type": "done", "id": self.rid, "status": status,
              "execution_count": self.count if isinstance(self.count, int) else None,
              "dropped_stream_bytes": self.dropped_stream,
              "dropped_display_items": self.dropped_items})


class Bridge:
    def __init__(self):
        from jupyter_client import KernelManager

        self.dir = tempfile.mkdtemp(prefix="cordon-kernel-", dir="/tmp")
        env = dict(os.environ)
        env.setdefault("IPYTHONDIR", os.path.join(self.dir, "ipython"))
        env.setdefault("MPLCONFIGDIR", os.path.join(self.dir, "matplotlib"))
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        self.env = env
        self.km = KernelManager(kernel_name="python3", transport="ipc",
                                ip=os.path.join(self.dir, "kernel"))
        self.km.connection_file = os.path.join(self.dir, "connection.json")
        self.kc = None

    def start(self):
        # The kernel's own stdout and stderr are /dev/null: ipykernel sends
        # what the code prints over iopub, and nothing may reach our stdout.
        self.km.start_kernel(env=self.env, stdin=_null, stdout=_null, stderr=_null)
        self.connect()

    def connect(self):
        if self.kc is not None:
            self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def restart(self, rid):
        if self.km.has_kernel:
            try:
                self.km.restart_kernel(now=True)
            except Exception:
                self.km.shutdown_kernel(now=True)
                self.km.start_kernel(env=self.env, stdin=_null, stdout=_null, stderr=_null)
        else:
            self.km.start_kernel(env=self.env, stdin=_null, stdout=_null, stderr=_null)
        self.connect()
        send({"type": "done", "id": rid, "status": "restarted",
              "execution_count": None, "dropped_stream_bytes": 0,
              "dropped_display_items": 0})

    def execute(self, rid, code, timeout):
        call = Call(rid)
        if not self.km.is_alive():
            call.done("dead")
            return
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        deadline = time.monotonic() + timeout
        interrupted_at = None
        reply = None
        while True:
            now = time.monotonic()
            if interrupted_at is None and now >= deadline:
                self.km.interrupt_kernel()
                interrupted_at = now
            elif interrupted_at is not None and now >= interrupted_at + INTERRUPT_GRACE:
                # Deaf to SIGINT (a C loop): only a restart gets it back.
                self.km.restart_kernel(now=True)
                self.connect()
                call.done("timeout_restarted")
                return
            try:
                msg = self.kc.get_iopub_msg(timeout=POLL)
            except queue.Empty:
                if not self.km.is_alive():
                    call.done("dead")
                    return
                # ZeroMQ drops iopub messages past its high-water mark, the
                # final "idle" among them: the shell's reply and a quiet
                # iopub end the call as well.
                if reply is not None:
                    break
                reply = self.shell_reply(msg_id, 0)
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg.get("msg_type")
            content = msg.get("content") or {}
            if kind == "stream":
                call.stream(content.get("name"), content.get("text", ""))
            elif kind in ("display_data", "execute_result", "update_display_data"):
                call.display(kind, content)
            elif kind == "error":
                call.error(content)
            elif kind == "execute_input":
                call.count = content.get("execution_count")
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        status = "ok"
        if reply is None:
            reply = self.shell_reply(msg_id, 5)
        if reply is not None:
            status = reply.get("content", {}).get("status", "ok")
            count = reply.get("content", {}).get("execution_count")
            if isinstance(count, int):
                call.count = count
        if interrupted_at is not None:
            status = "timeout"
        call.done(status if status in ("ok", "error", "aborted", "timeout") else "error")

    def shell_reply(self, msg_id, timeout):
        """The shell's reply to msg_id, or None if it is not there yet."""
        try:
            while True:
                reply = self.kc.get_shell_msg(timeout=timeout)
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    return reply
        except queue.Empty:
            return None

    def close(self):
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass


def main():
    try:
        bridge = Bridge()
        bridge.start()
    except Exception as e:
        send({"type": "fatal", "message": clean("%s: %s" % (type(e).__name__, e), NAME_CAP)})
        return 1
    send({"type": "ready", "protocol": PROTOCOL})
    try:
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            req = json.loads(line)
            op = req.get("op")
            if op == "execute":
                bridge.execute(req["id"], req["code"], float(req["timeout"]))
            elif op == "restart":
                bridge.restart(req["id"])
    finally:
        bridge.close()
    return 0


sys.exit(main())
