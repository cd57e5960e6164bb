#!/bin/bash
# fetch_digits.sh — puts the UCI handwritten digits CSV (digits.csv.gz, as
# Debian's python3-sklearn ships it) into crun's data cache without
# installing Python: `apt-get download python3-sklearn` + `dpkg -x` in a
# temporary directory, then that one file is kept.
#
#   scripts/fetch_digits.sh [DEST]   # DEST default: $CRUN_DIGITS or
#                                    # ${XDG_CACHE_HOME:-$HOME/.cache}/crun/digits.csv.gz
# Prints the path. Exits 0 at once when DEST already exists; 1 with the
# reason when the package cannot be downloaded (no network, no apt).
set -euo pipefail
PKG=python3-sklearn
MEMBER=usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
cache=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
dest=${1:-${CRUN_DIGITS:-$cache/crun/digits.csv.gz}}
if [ -s "$dest" ]; then echo "$dest"; exit 0; fi
for tool in apt-get dpkg; do
  command -v "$tool" >/dev/null || { echo "fetch_digits.sh: $tool not found (a Debian system is needed)" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/crun-digits.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt's _apt user may write the download there
version=$(apt-cache policy "$PKG" 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  echo "fetch_digits.sh: apt knows no $PKG (run apt-get update?)" >&2; exit 1
fi
if ! (cd "$tmp" && timeout 300 apt-get download "$PKG" >"$tmp/log" 2>&1); then
  echo "fetch_digits.sh: apt-get download $PKG=$version failed:" >&2; tail -3 "$tmp/log" >&2; exit 1
fi
deb=$(ls "$tmp"/*.deb)
dpkg -x "$deb" "$tmp/x"
[ -s "$tmp/x/$MEMBER" ] || { echo "fetch_digits.sh: $PKG $version has no $MEMBER" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
cp "$tmp/x/$MEMBER" "$dest.tmp.$$" && mv "$dest.tmp.$$" "$dest"
echo "fetch_digits.sh: $PKG $version -> $dest ($(stat -c %s "$dest") bytes)" >&2
echo "$dest"
