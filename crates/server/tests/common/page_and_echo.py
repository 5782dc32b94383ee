# A sandbox's dev server, for the preview tests: on 127.0.0.1:PORT (argv[1]),
# GET serves the files of the working directory, and a WebSocket upgrade
# echoes each text frame (under 126 bytes) back. Python's library only.
import hashlib, base64, os, socket, sys, threading

def serve(c):
    req = b''
    while b'\r\n\r\n' not in req:
        d = c.recv(4096)
        if not d:
            return
        req += d
    lines = req.split(b'\r\n')
    path = lines[0].split(b' ')[1].decode().split('?')[0]
    keys = [l.split(b':', 1)[1].strip() for l in lines if l.lower().startswith(b'sec-websocket-key:')]
    if not keys:
        name = os.path.basename(path) or 'index.html'
        try:
            body = open(name, 'rb').read()
            head = b'HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n'
        except OSError:
            body, head = b'not found\n', b'HTTP/1.1 404 Not Found\r\n'
        c.sendall(head + b'Content-Length: %d\r\nConnection: close\r\n\r\n' % len(body) + body)
        c.close()
        return
    accept = base64.b64encode(hashlib.sha1(keys[0] + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
              b'Sec-WebSocket-Accept: ' + accept + b'\r\n\r\n')
    def take(n):
        b = b''
        while len(b) < n:
            d = c.recv(n - len(b))
            if not d:
                raise EOFError
            b += d
        return b
    while True:
        h = take(2)
        op, n = h[0] & 15, h[1] & 127
        mask = take(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(take(n)))
        if op == 8:
            return
        c.sendall(bytes([0x80 | op, len(data)]) + data)

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
