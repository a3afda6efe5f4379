#!/usr/bin/env bash
# A local Kubernetes control plane for people:
#   scripts/k8s.sh up DIR [--nodes N] [--image IMAGE=PROGRAM ...] [--image-archive IMAGE=ARCHIVE ...]
#                             build or reuse the binaries, start etcd, kube-apiserver,
#                             kube-controller-manager, kube-scheduler, an image registry and
#                             real nodes (kubelet, containerd, runc, kube-proxy, CoreDNS; needs
#                             root) in DIR; prints DIR/kubeconfig when ready and stays in the
#                             foreground until Ctrl-C or `scripts/k8s.sh down DIR`
#   scripts/k8s.sh down DIR   stop it
# Then: kubectl --kubeconfig DIR/kubeconfig get nodes   (kubectl is in the binaries' directory,
# `scripts/k8s-bins.sh | tail -n1` prints it)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/k8s.sh up DIR [--nodes N] [--image IMAGE=PROGRAM ...] [--image-archive IMAGE=ARCHIVE ...] | down DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
command="$1" dir="$2"; shift 2
case "$command" in
  up)
    scripts/deps.sh runc containernetworking-plugins iptables busybox-static
    bin="$(scripts/k8s-bins.sh | tail -n1)"
    echo "[k8s] building the localcluster tool (cargo)" >&2
    cargo build --quiet --locked -p localcluster
    mkdir -p "$dir"
    exec target/debug/localcluster up "$dir" --bin "$bin" "$@"
    ;;
  down)
    cargo build --quiet --locked -p localcluster
    exec target/debug/localcluster down "$dir"
    ;;
  *) usage ;;
esac
