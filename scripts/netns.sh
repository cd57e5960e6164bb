#!/usr/bin/env bash
# netns.sh — N "hosts" on one machine for multi-host tests: one network
# namespace per host, joined by veth pairs to a bridge, each with its own
# address (10.77.0.<i+1>/24 on eth0), hostname (a UTS namespace per command)
# and /etc/hosts naming every host (h0, h1, ...). Needs root (CAP_SYS_ADMIN
# and CAP_NET_ADMIN), iproute2 and util-linux's unshare.
#
#   netns.sh check                 exit 0 when hosts can be built here, else
#                                  print why on stdout and exit 77
#   netns.sh up TAG N [PID]        build hosts 0..N-1 of run TAG ([a-z0-9]{1,6});
#                                  with PID, the run belongs to that process:
#                                  a later `up` or `sweep` removes the run once
#                                  that process is gone (a test runner killed
#                                  before its teardown)
#   netns.sh sweep                 remove the runs whose owner process is gone
#   netns.sh exec TAG I CMD...     run CMD as host I (its network, hostname hI)
#   netns.sh netonly TAG I CMD...  run CMD in host I's network namespace only
#                                  (this machine's hostname, mounts, /etc/hosts)
#   netns.sh addr I                the address of host I
#   netns.sh link TAG I up|down    plug host I's cable back in / pull it out
#   netns.sh pids TAG I            the processes running as host I
#   netns.sh down TAG              kill what runs in the hosts, remove them all
#   netns.sh run N CMD...          up with a fresh tag (exported as
#                                  CRUN_NETNS_TAG), run CMD, down on any exit
#   netns.sh agent HOST CMD...     an ssh stand-in for mpirun's plm_rsh_agent:
#                                  runs CMD (joined like ssh does) as host
#                                  HOST (hI or its address) of $CRUN_NETNS_TAG
#
# Names carry the tag, so runs at the same time never clash: namespaces
# crun-TAG-hI, bridge crb-TAG, root-side veth ends crv-TAG-I, the hosts file
# under /etc/netns/crun-TAG-hI/ (ip netns exec mounts it over /etc/hosts).
# Each run's bridge is its own broadcast domain, so every run may use the
# same subnet.
set -euo pipefail

SUBNET=10.77.0
die() { echo "netns.sh: $*" >&2; exit 2; }
ns() { echo "crun-$1-h$2"; }
addr() { echo "$SUBNET.$(($1 + 1))"; }

check_tag() {
  [[ "$1" =~ ^[a-z0-9]{1,6}$ ]] || die "bad tag '$1' (1 to 6 of [a-z0-9])"
}

cmd_check() {
  if [ "$(id -u)" -ne 0 ]; then echo "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"; exit 77; fi
  for t in ip unshare; do
    command -v "$t" >/dev/null 2>&1 || { echo "'$t' is not installed (iproute2, util-linux)"; exit 77; }
  done
  local tag probe
  tag="k$(printf '%04x' $((RANDOM)))"
  probe=$(ns "$tag" 0)
  if ! ip netns add "$probe" 2>/tmp/netns-check.$$; then
    echo "cannot create a network namespace: $(cat /tmp/netns-check.$$)"; rm -f /tmp/netns-check.$$; exit 77
  fi
  rm -f /tmp/netns-check.$$
  local ok=1 why=""
  ip link add "crb-$tag" type bridge 2>/dev/null || { ok=0; why="cannot create a bridge"; }
  ip link del "crb-$tag" 2>/dev/null || true
  ip netns exec "$probe" unshare --uts true 2>/dev/null || { ok=0; why="cannot create a UTS namespace"; }
  ip netns del "$probe"
  [ $ok -eq 1 ] || { echo "$why"; exit 77; }
}

OWNERS=/run/crun-netns

cmd_sweep() {
  local f tag
  for f in "$OWNERS"/*; do
    [ -f "$f" ] || continue
    tag=${f##*/}
    [[ "$tag" =~ ^[a-z0-9]{1,6}$ ]] || continue
    kill -0 "$(cat "$f")" 2>/dev/null || cmd_down "$tag"
  done
}

cmd_up() {
  local tag=$1 n=$2 owner=${3:-} i j
  check_tag "$tag"
  cmd_sweep
  if [ -n "$owner" ]; then
    [[ "$owner" =~ ^[0-9]+$ ]] || die "bad owner pid '$owner'"
    mkdir -p "$OWNERS"
    echo "$owner" >"$OWNERS/$tag"
  fi
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "bad host count '$n'"
  UP_TAG=$tag
  trap 'cmd_down "$UP_TAG"' ERR
  ip link add "crb-$tag" type bridge
  ip link set "crb-$tag" up
  for ((i = 0; i < n; i++)); do
    local name; name=$(ns "$tag" "$i")
    ip netns add "$name"
    ip link add "crv-$tag-$i" type veth peer name "crp-$tag-$i"
    ip link set "crp-$tag-$i" netns "$name"
    ip -n "$name" link set "crp-$tag-$i" name eth0
    ip -n "$name" addr add "$(addr "$i")/24" dev eth0
    ip -n "$name" link set lo up
    ip -n "$name" link set eth0 up
    ip link set "crv-$tag-$i" master "crb-$tag"
    ip link set "crv-$tag-$i" up
    mkdir -p "/etc/netns/$name"
    {
      echo "127.0.0.1 localhost"
      for ((j = 0; j < n; j++)); do echo "$(addr "$j") h$j"; done
    } >"/etc/netns/$name/hosts"
  done
  trap - ERR
}

# Runs argv as host I: its network namespace, a fresh UTS namespace named hI.
cmd_exec() {
  local tag=$1 i=$2
  shift 2
  check_tag "$tag"
  exec ip netns exec "$(ns "$tag" "$i")" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "h$i" "$@"
}

# Runs argv in host I's network namespace and nothing else of it.
cmd_netonly() {
  local tag=$1 i=$2
  shift 2
  check_tag "$tag"
  exec nsenter "--net=/run/netns/$(ns "$tag" "$i")" -- "$@"
}

cmd_link() {
  check_tag "$1"
  ip link set "crv-$1-$2" "$3"
}

cmd_pids() {
  check_tag "$1"
  ip netns pids "$(ns "$1" "$2")" 2>/dev/null || true
}

# Kills what runs in each host of the run (by pid), then removes the hosts,
# cables, bridge and hosts files; never fails, so it can run from a trap.
cmd_down() {
  local tag=$1 name p
  check_tag "$tag"
  for name in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^crun-$tag-h[0-9]*$" || true); do
    for p in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$name" 2>/dev/null || true
    rm -rf "/etc/netns/$name"
  done
  for name in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^crv-$tag-" || true); do
    ip link del "$name" 2>/dev/null || true
  done
  ip link del "crb-$tag" 2>/dev/null || true
  rmdir /etc/netns 2>/dev/null || true
  rm -f "$OWNERS/$tag"
  rmdir "$OWNERS" 2>/dev/null || true
}

cmd_run() {
  local n=$1
  shift
  CRUN_NETNS_TAG="r$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n' | cut -c1-5)"
  export CRUN_NETNS_TAG
  trap 'cmd_down "$CRUN_NETNS_TAG"' EXIT
  trap 'exit 130' INT TERM
  cmd_up "$CRUN_NETNS_TAG" "$n"
  "$@"
}

# mpirun calls the agent as `agent [ssh options] HOST WORD...`, the words
# forming one command line for the remote shell, as with ssh.
cmd_agent() {
  local tag=${CRUN_NETNS_TAG:-}
  [ -n "$tag" ] || die "agent: CRUN_NETNS_TAG is not set"
  while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
  local host=$1 i
  shift
  case "$host" in
    h[0-9]*) i=${host#h} ;;
    "$SUBNET".*) i=$((${host##*.} - 1)) ;;
    *) die "agent: unknown host '$host' (h0, h1, ... or $SUBNET.x)" ;;
  esac
  cmd_exec "$tag" "$i" sh -c "$*"
}

case "${1:-}" in
  check) cmd_check ;;
  up) [ $# -eq 3 ] || [ $# -eq 4 ] || die "usage: up TAG N [PID]"; cmd_up "$2" "$3" "${4:-}" ;;
  sweep) cmd_sweep ;;
  exec) [ $# -ge 4 ] || die "usage: exec TAG I CMD..."; shift; cmd_exec "$@" ;;
  netonly) [ $# -ge 4 ] || die "usage: netonly TAG I CMD..."; shift; cmd_netonly "$@" ;;
  addr) [ $# -eq 2 ] || die "usage: addr I"; addr "$2" ;;
  link) [ $# -eq 4 ] || die "usage: link TAG I up|down"; cmd_link "$2" "$3" "$4" ;;
  pids) [ $# -eq 3 ] || die "usage: pids TAG I"; cmd_pids "$2" "$3" ;;
  down) [ $# -eq 2 ] || die "usage: down TAG"; cmd_down "$2" ;;
  run) [ $# -ge 3 ] || die "usage: run N CMD..."; shift; cmd_run "$@" ;;
  agent) shift; cmd_agent "$@" ;;
  *) die "usage: netns.sh check|up|sweep|exec|netonly|addr|link|pids|down|run|agent (see the head of this file)" ;;
esac
