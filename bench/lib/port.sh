# A free TCP port on loopback, for a server a benchmark starts (bench/serve,
# bench/sandbox-create). Sourced, not run.
# shellcheck shell=bash

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
