# bwrap with isolation comparable to cordon's native sandbox, for the cold
# start's comparisons (bench/run, bench/cold-ab). Sourced, not run.
# shellcheck shell=bash

# The /etc entries cordon binds (crates/sandbox/src/supervisor/setup.rs,
# ETC_ALLOW) plus passwd and group, which cordon generates: bwrap gets the same.
ETC_ALLOW=(alternatives bash.bashrc ca-certificates ca-certificates.conf debian_version fonts gai.conf
    host.conf inputrc ld.so.cache ld.so.conf ld.so.conf.d locale.alias locale.conf locale.gen localtime
    magic magic.mime mime.types mtab networks nsswitch.conf os-release perl profile protocols python3
    python3.11 python3.12 python3.13 services shells ssl/certs ssl/openssl.cnf terminfo timezone vim X11
    xdg xml passwd group)

# bwrap with isolation comparable to cordon's (no seccomp or Landlock: bwrap
# has neither by default). $1 is the workspace.
bwrap_cmd() {
    local ws=$1 d args=(bwrap --unshare-all --unshare-user --die-with-parent --new-session
        --hostname cordon --ro-bind /usr /usr)
    for d in bin sbin lib lib32 lib64 libx32; do
        if [[ -L /$d ]]; then
            args+=(--symlink "$(readlink "/$d")" "/$d")
        elif [[ -d /$d ]]; then
            args+=(--ro-bind "/$d" "/$d")
        fi
    done
    for d in "${ETC_ALLOW[@]}"; do
        if [[ -L /etc/$d ]]; then
            args+=(--symlink "$(readlink "/etc/$d")" "/etc/$d")
        elif [[ -e /etc/$d ]]; then
            args+=(--ro-bind "/etc/$d" "/etc/$d")
        fi
    done
    args+=(--proc /proc --dev /dev --tmpfs /tmp --bind "$ws" /workspace --chdir /workspace
        --clearenv --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        --setenv HOME /tmp -- /bin/true)
    echo "${args[*]}"
}
