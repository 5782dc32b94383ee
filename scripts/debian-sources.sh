# Sourced by scripts that make Debian root file systems (scripts/image,
# deploy/environments/build): this machine's release and mirror, read from
# apt's configuration, never written into a file of the project.
#   suite    the release's code name (bookworm)
#   sources  "URI RELEASE" of each index apt uses for the release, its
#            updates and its security fixes
#   mirror   the URI of the release itself
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[[ -n $suite ]] || { echo "$0: /etc/os-release names no VERSION_CODENAME: a Debian host is needed" >&2; exit 1; }
mapfile -t sources < <(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(IDENTIFIER)' |
    awk -v s="$suite" '$3 == "Packages" && ($2 == s || $2 == s "-updates" || $2 == s "-security") {print $1, $2}' | sort -u)
mirror=$(printf '%s\n' "${sources[@]}" | awk -v s="$suite" '$2 == s {print $1; exit}')
[[ -n $mirror ]] || { echo "$0: apt has no index of $suite (run apt-get update)" >&2; exit 1; }
