#!/usr/bin/env bash
# Builds tools/porcupine-check (porcupine, the linearizability checker of etcd's robustness
# tests, with the lab's two models) with this machine's Go toolchain, once per source version,
# into a cache. The last line of stdout is the binary's path:
#   checker=$(scripts/porcupine-check.sh | tail -n1)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="$here/tools/porcupine-check"
say() { printf '[porcupine-check] %s\n' "$*" >&2; }

if ! command -v go >/dev/null; then
  say "error: Go is not installed (or not on PATH); the independent checker is built from Go modules"
  exit 1
fi
# The sources and the pinned module versions name the build.
version="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
cache="${LOCKEDJOB_TOOLS_CACHE:-$HOME/.cache/lockedjob/tools}/porcupine-check-$version"
if [ -x "$cache/porcupine-check" ]; then
  say "cached: $cache/porcupine-check"
  echo "$cache/porcupine-check"
  exit 0
fi
mkdir -p "$cache"
say "building (github.com/anishathalye/porcupine $(awk '$1 == "require" { print $3 }' "$src/go.mod"))"
started=$(date +%s)
log="$cache/build.log"
if ! (cd "$src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
    go build -trimpath -o "$cache/porcupine-check.tmp" .) >"$log" 2>&1; then
  say "build failed; the end of $log:"
  tail -n 20 "$log" >&2
  exit 1
fi
mv "$cache/porcupine-check.tmp" "$cache/porcupine-check"
say "built in $(( $(date +%s) - started )) s"
echo "$cache/porcupine-check"
