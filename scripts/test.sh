#!/usr/bin/env bash
# Runs every check and test, as CI does. Installs what the tests need when missing:
# cargo-machete (crates.io), redis-server and the real node's runc, CNI plugins, iptables and
# busybox (Debian), kubernetes-validate (PyPI), and the real control plane and node (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, helm, kubelet, kube-proxy,
# containerd, CoreDNS, crictl), the lab's independent checker (tools/porcupine-check) and
# client-go's leader election for the bench (tools/leaderelection-peer), built from Go modules
# into a cache; the operator image from the Dockerfile (scripts/image.sh: buildah, base images
# from Debian's packages and this machine's Rust toolchain). The real node's tests need root.
set -euo pipefail
cd "$(dirname "$0")/.."

# Say so, loudly, when a check cannot run, rather than passing without it.
for check in "cargo fmt --version" "cargo clippy --version"; do
  if ! $check >/dev/null 2>&1; then
    echo "error: \`$check\` failed: this machine lacks a check CI must run (rustup component add rustfmt clippy)" >&2
    exit 1
  fi
done

scripts/deps.sh redis-server runc containernetworking-plugins iptables busybox-static buildah debootstrap
# The bundled redis-server service is not used: tests start their own nodes on free ports.
command -v redis-server >/dev/null
# Kubernetes' OpenAPI schemas, offline, for the manifest checks in tests/chart.rs.
if ! python3 -m kubernetes_validate --version >/dev/null 2>&1; then
  echo "installing kubernetes-validate (PyPI)" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore kubernetes-validate \
    || echo "warning: kubernetes-validate could not be installed; tests/chart.rs will say it skipped" >&2
fi

echo "== control plane and node binaries (scripts/k8s-bins.sh; a cold build takes about 15 minutes)"
started=$(date +%s)
LOCKEDJOB_K8S_BIN="$(scripts/k8s-bins.sh | tail -n1)"
echo "   $LOCKEDJOB_K8S_BIN ($(( $(date +%s) - started )) s)"
export LOCKEDJOB_K8S_BIN
# helm and kubectl for the chart and kubectl tests: the ones built with the control plane.
export PATH="$LOCKEDJOB_K8S_BIN:$PATH"
# The lab's independent checker: porcupine with the models of tools/porcupine-check.
LOCKEDJOB_PORCUPINE_CHECK="$(scripts/porcupine-check.sh | tail -n1)"
export LOCKEDJOB_PORCUPINE_CHECK
# client-go's leader election, beside `lockedjob elect` in benches/elect.rs.
LOCKEDJOB_LEADERELECTION_PEER="$(scripts/go-tool.sh leaderelection-peer | tail -n1)"
export LOCKEDJOB_LEADERELECTION_PEER
for tool in porcupine-check leaderelection-peer; do
  echo "== go vet and gofmt (tools/$tool)"
  (cd "tools/$tool" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go vet . && test -z "$(gofmt -l .)")
done
# ServiceMonitor and PrometheusRule CRDs for the chart's monitoring objects (tests/helm.rs).
LOCKEDJOB_MONITORING_CRDS="$(scripts/monitoring-crds.sh | tail -n1)"
export LOCKEDJOB_MONITORING_CRDS

# The image builds beside the checks and the tests' compilation below (a cold build is a
# 10-minute release compile); the suites run once it is done, and tests/image.rs and
# tests/real_node_chart.rs find it cached.
image_log="$(mktemp)"
echo "== the operator image from the Dockerfile (scripts/image.sh, in the background; log $image_log)"
setsid -w scripts/image.sh >"$image_log" 2>&1 &
image_build=$!
# A check that fails below ends the run: stop the build with it (its own process group).
trap 'kill -TERM -- "-$image_build" 2>/dev/null || true; rm -f "$image_log"' EXIT

echo "== cargo fmt --check"
cargo fmt --all -- --check
# The fuzz targets are their own workspace (nightly, scripts/fuzz.sh); keep them formatted too.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
echo "== cargo machete (unused dependencies)"
if ! cargo machete --version >/dev/null 2>&1; then
  echo "installing cargo-machete (crates.io)" >&2
  cargo install --quiet --locked cargo-machete
fi
cargo machete
echo "== cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== the lock engine's rustdoc and doc tests (lockedjob-redlock, a library of its own)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked -p lockedjob-redlock --no-deps --quiet
cargo test --locked -p lockedjob-redlock --doc
echo "== benchmark smoke pass (cargo bench runs it in full)"
cargo test --locked --bench redlock
cargo test --locked --bench operator
cargo test --locked --bench elect
echo "== cargo test"
cargo test --locked --workspace --lib --bins --tests --no-run
# The suites run on a quiet machine: several are about timing under faults.
if ! wait "$image_build"; then
  cat "$image_log" >&2
  echo "error: scripts/image.sh failed (above)" >&2
  exit 1
fi
grep '^\[image\]' "$image_log" | tail -n1
cargo test --locked --workspace --lib --bins --tests
