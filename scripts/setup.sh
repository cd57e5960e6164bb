#!/usr/bin/env bash
# Installs the Debian packages crun needs, only those that are missing.
# Idempotent: prints nothing and does nothing when every package is present.
set -euo pipefail

# iproute2: scripts/netns.sh (multihost_spec); munge, slurm*: scripts/slurm_local.sh
# (slurm_spec; about 4 s to install on Debian 12, 6 packages)
PKGS=(lua5.4 liblua5.4-dev libuv1-dev lua-busted lua-dkjson libopenblas-dev
      libopenmpi-dev openmpi-bin libreadline-dev libsodium-dev zlib1g-dev cmake make gcc pkg-config tmux
      iproute2 munge slurmctld slurmd slurm-client)
# libprotobuf-c-dev, protobuf-c-compiler: crun.metrics' TensorBoard event files;
# luarocks: the rockspec route (make check-install); lua-ldoc, doxygen: make docs;
# help2man: crun-lua's man page in the .deb (these six: about 16 s on Debian 12);
# dpkg-dev: dpkg-shlibdeps, which CPack runs for the .deb's Depends (make package)
PKGS+=(libprotobuf-c-dev protobuf-c-compiler luarocks lua-ldoc doxygen help2man dpkg-dev)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: missing packages (${missing[*]}) and not root and no sudo" >&2; exit 1
  fi
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=900 update -qq
# The munge and Slurm daemons must not start as system services (the specs run
# their own in a temporary directory): while installing, a policy-rc.d that
# refuses every service start, unless the machine already has one.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 755 "$policy" && own_policy=1
fi
rc=0
$SUDO apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
[ $own_policy = 1 ] && $SUDO rm -f "$policy"
[ $rc = 0 ] || exit $rc
echo "setup: done"
