#!/usr/bin/env bash
# Runs the checks and the test tiers (docs/testing.md, "Tiers"):
#   scripts/test.sh              everything, as CI does (.ci/run)
#   scripts/test.sh checks       fmt, machete, clippy, the engine's rustdoc, and the hermetic
#                                tier: what a plain `cargo test` runs (no root, no cluster)
#   scripts/test.sh redis        the Redis tier: real redis-server, the lab's checker
#   scripts/test.sh kubernetes   the Kubernetes tier (root): real control planes and nodes, the
#                                chart, the image, the benches' smoke passes
# Installs what a tier needs when missing: redis-server, runc, CNI plugins, iptables, busybox,
# buildah, debootstrap and zsh (Debian), cargo-machete (crates.io), kubernetes-validate (PyPI),
# the control plane and node (scripts/k8s-bins.sh) and the Go tools (scripts/go-tool.sh) built
# from Go modules into a cache, and the operator image from the Dockerfile (scripts/image.sh).
# Each step prints its seconds; the table in docs/testing.md comes from those lines.
set -euo pipefail
cd "$(dirname "$0")/.."

tier="${1:-all}"
case "$tier" in
  all | checks | redis | kubernetes) ;;
  *) echo "usage: scripts/test.sh [all|checks|redis|kubernetes]" >&2; exit 2 ;;
esac
wants() { [ "$tier" = all ] || [ "$tier" = "$1" ]; }

# step NAME COMMAND...: runs a step and says how long it took.
step() {
  local name="$1" started
  shift
  echo "== $name"
  started=$(date +%s)
  "$@"
  echo "== $name: $(($(date +%s) - started)) s"
}

# Say so, loudly, when a check cannot run, rather than passing without it.
for check in "cargo fmt --version" "cargo clippy --version"; do
  if ! $check >/dev/null 2>&1; then
    echo "error: \`$check\` failed: this machine lacks a check CI must run (rustup component add rustfmt clippy)" >&2
    exit 1
  fi
done

install_checks() {
  # zsh parses the completion script in the hermetic tier (which fails under CI=true without it).
  if [ "$tier" = all ]; then scripts/deps.sh zsh; fi
  if ! cargo machete --version >/dev/null 2>&1; then
    echo "installing cargo-machete (crates.io)" >&2
    cargo install --quiet --locked cargo-machete
  fi
}

install_redis() {
  # The bundled redis-server service is not used: tests start their own nodes on free ports.
  scripts/deps.sh redis-server
  command -v redis-server >/dev/null
  # The lab's independent checker: porcupine with the models of tools/porcupine-check.
  LOCKEDJOB_PORCUPINE_CHECK="$(scripts/porcupine-check.sh | tail -n1)"
  export LOCKEDJOB_PORCUPINE_CHECK
}

install_kubernetes() {
  scripts/deps.sh redis-server runc containernetworking-plugins iptables busybox-static buildah debootstrap
  # Kubernetes' OpenAPI schemas, offline, for the manifest checks (kubernetes/chart_render.rs).
  if ! python3 -m kubernetes_validate --version >/dev/null 2>&1; then
    echo "installing kubernetes-validate (PyPI)" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore kubernetes-validate
  fi
  LOCKEDJOB_K8S_BIN="$(scripts/k8s-bins.sh | tail -n1)"
  export LOCKEDJOB_K8S_BIN
  # helm and kubectl for the chart and kubectl tests: the ones built with the control plane.
  export PATH="$LOCKEDJOB_K8S_BIN:$PATH"
  # client-go's leader election, beside `lockedjob elect` in benches/elect.rs.
  LOCKEDJOB_LEADERELECTION_PEER="$(scripts/go-tool.sh leaderelection-peer | tail -n1)"
  export LOCKEDJOB_LEADERELECTION_PEER
  # ServiceMonitor and PrometheusRule CRDs for the chart's monitoring objects (kubernetes/helm.rs).
  LOCKEDJOB_MONITORING_CRDS="$(scripts/monitoring-crds.sh | tail -n1)"
  export LOCKEDJOB_MONITORING_CRDS
}

go_checks() {
  for tool in porcupine-check leaderelection-peer; do
    (cd "tools/$tool" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go vet . && test -z "$(gofmt -l .)")
  done
}

static_checks() {
  cargo fmt --all -- --check
  # The fuzz targets are their own workspace (nightly, scripts/fuzz.sh); keep them formatted too.
  cargo fmt --manifest-path fuzz/Cargo.toml -- --check
  cargo machete
  cargo clippy --locked --workspace --all-targets -- -D warnings
  # The lock engine is a library of its own: its rustdoc must build clean.
  RUSTDOCFLAGS="-D warnings" cargo doc --locked -p lockedjob-redlock --no-deps --quiet
}

# The hermetic tier: every test that needs no root, cluster, Redis or tool beyond the
# toolchain; the other tiers' tests are listed as ignored, with the command that runs them.
hermetic_tier() {
  cargo test --locked --workspace --lib --bins --tests
  cargo test --locked -p lockedjob-redlock --doc
}

redis_tier() {
  cargo test --locked -p lockedjob-operator --lib --test redis -- --include-ignored
  cargo test --locked --bench redlock
}

kubernetes_tier() {
  cargo test --locked -p lockedjob-operator --test kubernetes -- --include-ignored
  cargo test --locked -p localcluster --lib --tests -- --include-ignored
  cargo test --locked -p quickstart --tests -- --include-ignored
  cargo test --locked --bench operator
  cargo test --locked --bench elect
}

image_build=""
image_log=""
if wants kubernetes; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: the Kubernetes tier starts real nodes and needs root" >&2
    exit 1
  fi
  step "install: the Kubernetes tier (a cold Go build takes about 15 minutes)" install_kubernetes
  # The image builds beside the checks and the tests' compilation (cold, a 10-minute release
  # build); the Kubernetes tier waits for it, and its image and chart tests find it cached.
  image_log="$(mktemp)"
  echo "== the operator image from the Dockerfile (scripts/image.sh, in the background; log $image_log)"
  setsid -w scripts/image.sh >"$image_log" 2>&1 &
  image_build=$!
  # A check that fails below ends the run: stop the build with it (its own process group).
  trap 'kill -TERM -- "-$image_build" 2>/dev/null || true; rm -f "$image_log"' EXIT
fi
if wants redis || wants kubernetes; then step "install: the Redis tier" install_redis; fi
if wants checks; then
  step "install: the checks" install_checks
  step "fmt, machete, clippy, rustdoc" static_checks
fi
if [ "$tier" = all ]; then step "go vet and gofmt (tools/)" go_checks; fi

# One build of every test target and bench, so the tiers below only run.
targets=(--lib --bins --tests)
if wants redis || wants kubernetes; then targets=(--all-targets); fi
step "build the tests" cargo test --locked --workspace "${targets[@]}" --no-run

if wants checks; then step "hermetic tier" hermetic_tier; fi
if [ -n "$image_build" ]; then
  # The tiers below are about timing under faults: they run on a quiet machine.
  if ! wait "$image_build"; then
    cat "$image_log" >&2
    echo "error: scripts/image.sh failed (above)" >&2
    exit 1
  fi
  grep '^\[image\]' "$image_log" | tail -n1
fi
if wants redis; then step "redis tier" redis_tier; fi
if wants kubernetes; then step "kubernetes tier" kubernetes_tier; fi
