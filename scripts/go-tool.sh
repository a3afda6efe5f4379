#!/usr/bin/env bash
# Builds a Go dev tool, tools/NAME (pinned modules in its go.mod and go.sum), with this
# machine's Go toolchain, once per source version, into a cache. The last line of stdout is the
# binary's path:
#   tool=$(scripts/go-tool.sh NAME | tail -n1)
# Tools: porcupine-check (the lab's independent checker), leaderelection-peer (client-go's
# leader election, beside `lockedjob elect` in benches/elect.rs).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
name="${1:?usage: scripts/go-tool.sh NAME (a directory under tools/)}"
src="$here/tools/$name"
say() { printf '[%s] %s\n' "$name" "$*" >&2; }

if [ ! -f "$src/go.mod" ]; then
  say "error: no Go module at $src"
  exit 1
fi
if ! command -v go >/dev/null; then
  say "error: Go is not installed (or not on PATH); $name is built from Go modules"
  exit 1
fi
# The sources and the pinned module versions name the build.
version="$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-16)"
cache="${LOCKEDJOB_TOOLS_CACHE:-$HOME/.cache/lockedjob/tools}/$name-$version"
if [ -x "$cache/$name" ]; then
  say "cached: $cache/$name"
  echo "$cache/$name"
  exit 0
fi
mkdir -p "$cache"
say "building ($(awk '$1 == "require" && NF == 3 { print $2, $3 } /^\t[^ ]+ v[^ ]+$/ { print $1, $2 }' "$src/go.mod" | paste -sd, -))"
started=$(date +%s)
log="$cache/build.log"
if ! (cd "$src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
    go build -trimpath -o "$cache/$name.tmp" .) >"$log" 2>&1; then
  say "build failed; the end of $log:"
  tail -n 20 "$log" >&2
  exit 1
fi
mv "$cache/$name.tmp" "$cache/$name"
say "built in $(( $(date +%s) - started )) s"
echo "$cache/$name"
