# What a benchmark needs of a server it starts (bench/serve,
# bench/sandbox-create, bench/sandbox-pool, bench/vm-pool, bench/vm-memory):
# a free TCP port on loopback, and a wait until it answers. Sourced, not run.
# shellcheck shell=bash

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_up URL PID LOG: waits up to 20 s for URL/health to answer; if it
# does not, or process PID ends first, prints LOG's end and fails.
wait_up() {
    local url=$1 pid=$2 log=$3
    for _ in $(seq 400); do
        curl -fsS "$url/health" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "${0##*/}: the server at $url did not come up; the end of its log:" >&2
    tail -n 20 "$log" >&2
    return 1
}
