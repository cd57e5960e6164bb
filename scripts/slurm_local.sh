#!/usr/bin/env bash
# slurm_local.sh — a one-host Slurm cluster in a directory of its own, for
# tests and for trying the Slurm examples: munged with a fresh key,
# slurmctld and slurmd (Debian's munge, slurmctld, slurmd, slurm-client),
# one node named after this host with CPUS cpus, one partition.
#
#   slurm_local.sh check           exit 0 when a cluster can start here, else
#                                  print why on stdout and exit 77
#   slurm_local.sh DIR CMD...      start the cluster (config, state and logs
#                                  in DIR), wait until the node is idle, run
#                                  CMD with SLURM_CONF set, stop the daemons
#                                  on any exit; exits with CMD's status, or
#                                  77 saying why when the cluster did not
#                                  come up (the reason on stdout, logs on stderr)
#
# Ports: CRUN_SLURM_PORT (default 6817) for slurmctld and the next one for
# slurmd; inside a network namespace (scripts/netns.sh) the defaults never
# clash with another run. CRUN_SLURM_CPUS (default 4) is the node's CPU count
# as Slurm sees it (config_overrides: more than the machine has is fine).
# Needs root: slurmd starts job steps as the submitting user.
set -euo pipefail

die() { echo "slurm_local.sh: $*" >&2; exit 2; }

cmd_check() {
  if [ "$(id -u)" -ne 0 ]; then echo "not root (slurmd must run as root)"; exit 77; fi
  local t
  for t in munged slurmctld slurmd srun sbatch sinfo; do
    command -v "$t" >/dev/null 2>&1 || {
      echo "'$t' is not installed (Debian: munge slurmctld slurmd slurm-client)"; exit 77; }
  done
}

write_conf() {
  local dir=$1 node=$2 port=$3 cpus=$4
  cat >"$dir/slurm.conf" <<EOF
ClusterName=crunlocal
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
MessageTimeout=10
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=30 State=UP
EOF
}

# The slurmstepd processes of this cluster: their environment names its
# config (slurmd passes SLURM_CONF on).
cluster_stepds() {
  local d p
  for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = slurmstepd ] || continue
    p=${d#/proc/}
    tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" && echo "$p"
  done
  return 0
}

PIDS=()
# Lets the job steps finish reporting to slurmctld (up to 5 s), then stops
# what is left of them and the daemons: TERM, and KILL after 5 s.
stop_all() {
  local p i
  for ((i = 0; i < 50; i++)); do [ -z "$(cluster_stepds)" ] && break; sleep 0.1; done
  PIDS=($(cluster_stepds) "${PIDS[@]}")
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}

# Waits up to $2 seconds for the node to be idle.
wait_idle() {
  local deadline=$((SECONDS + $2)) state
  while [ $SECONDS -lt $deadline ]; do
    state=$(sinfo -h -N -o %T 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    sleep 0.2
  done
  local err
  err=$(grep -h "error:" "$1/slurmd.log" "$1/slurmctld.log" 2>/dev/null | grep -v "state file\|backup state" | tail -n 2 |
        sed 's/^\[[^]]*\] //' | tr '\n' ' ' || true)
  echo "slurm_local.sh: the node is not idle after $2 s (state '${state:-none}'): ${err:-see the logs}"
  tail -n 20 "$1"/slurmctld.log "$1"/slurmd.log "$1"/munged.log >&2 2>/dev/null || true
  return 1
}

cmd_start() {
  local dir=$1
  shift
  [ -d "$dir" ] || die "no directory '$dir'"
  dir=$(cd "$dir" && pwd)
  local node port cpus
  node=$(hostname)
  port=${CRUN_SLURM_PORT:-6817}
  cpus=${CRUN_SLURM_CPUS:-4}
  mkdir -p "$dir/state" "$dir/spool"
  chmod 755 "$dir" # munged wants its socket's directory searchable by all
  write_conf "$dir" "$node" "$port" "$cpus"
  export SLURM_CONF=$dir/slurm.conf
  trap stop_all EXIT
  trap 'exit 130' INT TERM
  (umask 077 && head -c 1024 /dev/urandom >"$dir/munge.key")
  munged -F --force --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" &
  PIDS+=($!)
  local i=0
  while [ ! -S "$dir/munge.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  if [ ! -S "$dir/munge.sock" ]; then
    echo "slurm_local.sh: munged did not start: $(tail -n 1 "$dir/munged.log" 2>/dev/null)"
    exit 77
  fi
  slurmctld -D -i -f "$SLURM_CONF" >>"$dir/slurmctld.out" 2>&1 &
  PIDS+=($!)
  slurmd -D -f "$SLURM_CONF" -N "$node" >>"$dir/slurmd.out" 2>&1 &
  PIDS+=($!)
  wait_idle "$dir" 30 || exit 77
  "$@"
}

case "${1:-}" in
  check) cmd_check ;;
  "") die "usage: slurm_local.sh check | DIR CMD..." ;;
  *) [ $# -ge 2 ] || die "usage: slurm_local.sh DIR CMD..."; cmd_start "$@" ;;
esac
