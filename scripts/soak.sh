#!/usr/bin/env bash
# The cluster soak (docs/testing.md, "The cluster soak"): two local clusters with the operator,
# seeded random faults, judged by our checker and by porcupine. Builds what it needs (the first
# run builds the control plane and node from Go modules, ~15 minutes; needs root), then runs
#   scripts/soak.sh [--minutes M] [--seed S] [--out DIR] [--split-nodes] [--unfenced-store]
# e.g. scripts/soak.sh --minutes 60 --seed 42 --out /tmp/soak-hour; it exits 1 when either
# checker objects, and DIR/report.json and DIR/timeline.svg say why.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh redis-server runc containernetworking-plugins iptables busybox-static
echo "[soak] control plane binaries (scripts/k8s-bins.sh) and the independent checker" >&2
LOCKEDJOB_K8S_BIN="$(scripts/k8s-bins.sh | tail -n1)"
LOCKEDJOB_PORCUPINE_CHECK="$(scripts/porcupine-check.sh | tail -n1)"
export LOCKEDJOB_K8S_BIN LOCKEDJOB_PORCUPINE_CHECK
echo "[soak] building lockedjob and the soak (cargo)" >&2
cargo build --quiet --locked --bin lockedjob
cargo build --quiet --locked -p quickstart --bin soak
QUICKSTART_LOCKEDJOB="$PWD/target/debug/lockedjob" exec target/debug/soak "$@"
