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

# CI keeps a part of a failed run's output: a backtrace per failing test (CI's environment
# sets RUST_BACKTRACE=1) pushed the second failure's message out of it. The panic's message and
# place stay; a developer's own RUST_BACKTRACE is left alone.
if [ "${CI:-}" = true ]; then export RUST_BACKTRACE=0; fi

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
}

# The Go builds (a cold build of the control plane takes about 15 minutes) write their paths
# to a file; they run in the background, beside the checks and the Rust build.
go_builds() {
  local out="$1" k8s peer crds
  k8s="$(scripts/k8s-bins.sh | tail -n1)"
  # client-go's leader election, beside `lockedjob elect` in benches/elect.rs.
  peer="$(scripts/go-tool.sh leaderelection-peer | tail -n1)"
  # ServiceMonitor and PrometheusRule CRDs for the chart's objects (kubernetes/helm.rs).
  crds="$(scripts/monitoring-crds.sh | tail -n1)"
  go_checks
  printf 'LOCKEDJOB_K8S_BIN=%s\nLOCKEDJOB_LEADERELECTION_PEER=%s\nLOCKEDJOB_MONITORING_CRDS=%s\n' \
    "$k8s" "$peer" "$crds" >"$out"
}

# niced COMMAND...: runs COMMAND in a session of its own (a process group the EXIT trap can
# stop) at the lowest CPU priority. A session is a scheduling group of its own (autogroup), and
# nice counts only inside a group: the group's nice is set too.
niced() {
  setsid -w nice -n 19 bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec "$@"' \
    niced "$@"
}

# Waits for the background job PID (its output in LOG), failing the run with its log if it did.
wait_for() {
  local pid="$1" log="$2" what="$3" started
  started=$(date +%s)
  if ! wait "$pid"; then
    cat "$log" >&2
    echo "error: $what failed (above)" >&2
    exit 1
  fi
  echo "== waited $(($(date +%s) - started)) s for $what"
}

# With the flags scripts/go-tool.sh builds with, so vet finds the packages in Go's build cache
# (without them it compiled client-go again: 102 s).
go_checks() {
  local tool
  for tool in porcupine-check leaderelection-peer; do
    (cd "tools/$tool" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly go vet -trimpath . \
      && test -z "$(gofmt -l .)")
  done
}

format_checks() {
  cargo fmt --all -- --check
  # The fuzz targets are their own workspace (nightly, scripts/fuzz.sh); keep them formatted too.
  cargo fmt --manifest-path fuzz/Cargo.toml -- --check
  cargo machete
}

# Clippy and rustdoc compile in check mode, which the test build cannot share (docs/testing.md,
# "Build settings"): a target directory of their own lets them run beside it. A subshell, so
# that the directory stays theirs.
compile_checks() (
  started=$(date +%s)
  export CARGO_TARGET_DIR="$PWD/target/checks"
  cargo clippy --locked --workspace --all-targets -- -D warnings
  # Every crate's rustdoc must build clean (the lock engine is a library of its own). The whole
  # workspace: `-p lockedjob-redlock` alone re-checked the dependencies for its features (110 s
  # against 34 s for all five crates).
  RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
  echo "== clippy, rustdoc: $(($(date +%s) - started)) s"
)

# The background checks' verdict (a failure ends the run, with their log); with `if-ended`,
# only when they have ended already, so that a failure ends the run early.
collect_checks() {
  [ -n "$checks_build" ] || return 0
  if [ "${1:-}" = if-ended ] && kill -0 "$checks_build" 2>/dev/null; then return 0; fi
  wait_for "$checks_build" "$background/checks.log" "clippy and rustdoc"
  checks_build=""
  grep '^== clippy' "$background/checks.log" || true
}

# The hermetic tier: every test that needs no root, cluster, Redis or tool beyond the
# toolchain; the other tiers' tests are listed as ignored, with the command that runs them.
hermetic_tier() {
  cargo test --locked --workspace --lib --bins --tests
}

# Every cargo call names the whole workspace: one that selects a package (`-p`) resolves the
# dependencies' features for that package alone and rebuilds them (measured: 2 minutes each
# for localcluster's and the soak's tests).
redis_tier() {
  cargo test --locked --workspace --lib --test redis -- --include-ignored
  # The engine's rustdoc example starts three real nodes.
  cargo test --locked --workspace --doc
  cargo test --locked --workspace --bench redlock
}

# The clusters of the soak, of localcluster's tests and of the benches' smoke passes run beside
# the kubernetes binary's (the tier leaves about three quarters of the two cores idle): they
# hold a shared lock on a file whose exclusive lock the binary's heavy tests take, so the load
# test and the five-node chart never share the machine with them (docs/testing.md,
# "Scheduling"). Host cleanup is checked last, with no other cluster running.
kubernetes_tier() {
  local times lock lane lane_lock beside_lane status=0 beside_status=0
  times="$(mktemp)"
  lock="$(mktemp)"
  lane="$background/beside.log"
  exec {lane_lock}>"$lock"
  flock --shared "$lane_lock"
  # The lane, a process group of its own, keeps the lock until it ends; the commands it runs
  # (and what they might leave behind) do not inherit it. The benches run after the soak: in
  # a lane of their own they started with the binary, at the tier's busiest, and the operator
  # bench's smoke pass missed a run (one rehearsal of three). That pass runs on two nodes
  # rather than three: a cluster of one slot, like the binary's (`cargo bench` keeps three).
  setsid -w bash -c "set -e
    started=\$(date +%s)
    cargo test --locked --workspace --test soak --test cluster --test real_node \\
      -- --include-ignored ${lane_lock}>&-
    BENCH_REAL_NODES=2 cargo test --locked --workspace --bench operator --bench elect ${lane_lock}>&-
    echo \"== the lane: \$((\$(date +%s) - started)) s\"" \
    >"$lane" 2>&1 &
  beside_lane=$!
  exec {lane_lock}>&-
  echo "== beside the kubernetes binary: the soak, localcluster's tests, the benches' smoke passes (log $lane)"
  LOCKEDJOB_ALONE_LOCK="$lock" LOCKEDJOB_TEST_TIMES="$times" cargo test --locked --workspace \
    --test kubernetes -- --include-ignored || status=$?
  # Printed on failure too, when it is wanted most.
  echo "== the kubernetes binary's slowest tests (seconds, from each test's turn)"
  sort -rn "$times" | head -n 12
  rm -f "$times" "$lock"
  wait "$beside_lane" || beside_status=$?
  echo "== the lane beside it:"
  if [ "$beside_status" -eq 0 ]; then
    grep -E '^(test result|     Running|== )' "$lane" || true
  else
    cat "$lane"
  fi
  [ "$status" -eq 0 ] && [ "$beside_status" -eq 0 ] || return 1
  cargo test --locked --workspace --test real_node_cleanup -- --include-ignored
}

go_build=""
image_build=""
checks_build=""
background="$(mktemp -d)"
# Each background job leads a process group of its own (setsid); only those still running are
# signalled, so the trap never reaches a group that reused a finished job's id.
trap 'for group in $(jobs -pr); do kill -TERM -- "-$group" 2>/dev/null || true; done; rm -rf "$background"' EXIT
if wants kubernetes; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: the Kubernetes tier starts real nodes and needs root" >&2
    exit 1
  fi
  step "install: the Kubernetes tier" install_kubernetes
  # Both builds run in the background, in process groups of their own, beside the checks and
  # the tests' compilation; a check that fails below ends the run and stops them. The tiers
  # wait for the Go builds.
  echo "== the Go builds (scripts/k8s-bins.sh, scripts/go-tool.sh; in the background, log $background/go.log)"
  setsid -w bash -c "set -euo pipefail; $(declare -f go_builds go_checks); go_builds $background/go.env" \
    >"$background/go.log" 2>&1 &
  go_build=$!
  # The image (cold, a 10-minute release build) at the lowest priority: only the image test and
  # the chart on real nodes need it, and they wait for this build (scripts/image.sh builds one
  # at a time) and find it cached.
  echo "== the operator image from the Dockerfile (scripts/image.sh, niced in the background; log $background/image.log)"
  LOCKEDJOB_IMAGE_CPU_SHARES=2 niced scripts/image.sh >"$background/image.log" 2>&1 &
  image_build=$!
fi
if wants redis || wants kubernetes; then step "install: the Redis tier" install_redis; fi
if wants checks; then
  step "install: the checks" install_checks
  step "fmt, machete" format_checks
  if [ "$tier" = all ]; then
    # At the lowest CPU priority, beside the build and the tiers: the Kubernetes tier leaves
    # about three quarters of the two cores idle (docs/testing.md, "Time"). After the image,
    # which two tests wait for (a cold one takes about 10 minutes on a fresh machine).
    echo "== clippy, rustdoc (niced in the background, after the image; log $background/checks.log)"
    niced bash -c "set -euo pipefail
      while [ -n '$image_build' ] && kill -0 '$image_build' 2>/dev/null; do sleep 5; done
      $(declare -f compile_checks); compile_checks" >"$background/checks.log" 2>&1 &
    checks_build=$!
  else
    step "clippy, rustdoc" compile_checks
  fi
fi

# One build of every test target and bench, so the tiers below only run.
targets=(--lib --bins --tests)
if wants redis || wants kubernetes; then targets=(--all-targets); fi
step "build the tests" cargo test --locked --workspace "${targets[@]}" --no-run
collect_checks if-ended

if wants checks; then step "hermetic tier" hermetic_tier; fi
if [ -n "$go_build" ]; then
  # The tiers below are about timing under faults: no build at normal priority runs beside them.
  wait_for "$go_build" "$background/go.log" "the Go builds"
  grep -h '^\[' "$background/go.log" | grep -v downloading | tail -n4 || true
  set -a
  # shellcheck disable=SC1091
  source "$background/go.env"
  set +a
  # helm and kubectl for the chart and kubectl tests: the ones built with the control plane.
  export PATH="$LOCKEDJOB_K8S_BIN:$PATH"
fi
# Not in a lane beside the Kubernetes tier: the lab's scenarios (2 s leases, paused clients,
# store writes with deadlines) failed there once in two rehearsals (docs/testing.md, "Time").
if wants redis; then
  collect_checks if-ended
  step "redis tier" redis_tier
fi
if wants kubernetes; then
  collect_checks if-ended
  step "kubernetes tier" kubernetes_tier
fi
if [ -n "$image_build" ]; then
  wait_for "$image_build" "$background/image.log" "scripts/image.sh"
  grep '^\[image\]' "$background/image.log" | tail -n1 || true
fi
collect_checks
