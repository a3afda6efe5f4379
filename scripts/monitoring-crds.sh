#!/usr/bin/env bash
# Fetches prometheus-operator's CRDs for ServiceMonitor and PrometheusRule from the Go module
# proxy (the module ships them in example/prometheus-operator-crd/), once per pinned version,
# into a cache, so tests install the chart's monitoring objects against the real schemas.
# Versions: scripts/k8s-versions.env. Cache: $LOCKEDJOB_K8S_CACHE (default ~/.cache/lockedjob/k8s).
# The last line of stdout is the directory holding the two CRD files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=k8s-versions.env
source "$here/k8s-versions.env"

say() { printf '[monitoring-crds] %s\n' "$*" >&2; }

cache_root="${LOCKEDJOB_K8S_CACHE:-$HOME/.cache/lockedjob/k8s}"
out="$cache_root/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/crds"
files=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)

complete() { for f in "${files[@]}"; do [ -s "$out/$f" ] || return 1; done; }
if complete; then
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null; then
  say "error: Go is not installed: the CRDs come from the Go module proxy (install Go 1.26)"
  exit 1
fi
module="github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION"
say "downloading $module (about 4 MB)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dir="$(cd "$work" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "$module" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
if [ -z "$dir" ] || [ ! -d "$dir/example/prometheus-operator-crd" ]; then
  say "error: $module has no example/prometheus-operator-crd/ (download failed or layout changed)"
  exit 1
fi
mkdir -p "$out"
for f in "${files[@]}"; do cp "$dir/example/prometheus-operator-crd/$f" "$out/$f.tmp" && mv "$out/$f.tmp" "$out/$f"; done
say "cached: $out"
echo "$out"
