#!/usr/bin/env bash
# Builds the real control plane and node from Go modules, once per pinned version, into a cache:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (k8s.io/kubernetes)
#   kubelet kube-proxy                                             (k8s.io/kubernetes)
#   etcd                                                           (go.etcd.io/etcd/server/v3)
#   helm                                                           (helm.sh/helm/v4)
#   containerd containerd-shim-runc-v2 ctr                         (github.com/containerd/containerd/v2)
#   coredns                                                        (github.com/coredns/coredns)
#   crictl                                                         (sigs.k8s.io/cri-tools)
#   registry                                   (github.com/distribution/distribution/v3)
# Versions: scripts/k8s-versions.env; the directory's name carries the control plane's, a
# stamp file beside each other component carries its own. Cache: $LOCKEDJOB_K8S_CACHE (default
# ~/.cache/lockedjob/k8s). Progress goes to stderr; the last line of stdout is the directory
# holding the binaries, so `bin=$(scripts/k8s-bins.sh | tail -n1)` works.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=k8s-versions.env
source "$here/k8s-versions.env"

say() { printf '[k8s-bins] %s\n' "$*" >&2; }

if ! command -v go >/dev/null; then
  say "error: Go is not installed (or not on PATH). The control plane is built from Go modules:"
  say "install Go 1.26 or newer (Debian: golang-go is too old; use the toolchain of this machine image)"
  exit 1
fi

cache_root="${LOCKEDJOB_K8S_CACHE:-$HOME/.cache/lockedjob/k8s}"
bin="$cache_root/kubernetes-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION/bin"
control_plane=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
node=(kubelet kube-proxy)
containerd=(containerd containerd-shim-runc-v2 ctr)
all=("${control_plane[@]}" "${node[@]}" etcd helm "${containerd[@]}" coredns crictl registry)

# present NAME VERSION BINARY...: every binary is there and, with a VERSION, was built at it.
present() {
  local name="$1" version="$2"; shift 2
  for b in "$@"; do [ -x "$bin/$b" ] || return 1; done
  [ -z "$version" ] || [ "$(cat "$bin/.$name.version" 2>/dev/null)" = "$version" ]
}
complete() {
  present control-plane "" "${control_plane[@]}" && present node "" "${node[@]}" \
    && present etcd "" etcd && present helm "" helm \
    && present containerd "$CONTAINERD_VERSION" "${containerd[@]}" \
    && present coredns "$COREDNS_VERSION" coredns && present crictl "$CRICTL_VERSION" crictl \
    && present registry "$DISTRIBUTION_VERSION" registry
}
if complete; then
  say "cached: $bin"
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
work="$(mktemp -d)"
# The Go tool's chatter (hundreds of "go: downloading" lines) goes to a log; its tail is shown
# only when a build fails.
log="$cache_root/build.log"
: >"$log"
finish() {
  local status=$?
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then
    say "error: the build failed (exit $status); the last lines of $log:"
    tail -n 40 "$log" >&2
  fi
}
trap finish EXIT

# Scratch module whose go.mod replaces every module that $1's go.mod replaces with a local
# path ("=> ./x" or "=> ../x") by the published module at version $2.
scratch_module() {
  local dir="$1" module="$2" version="$3" staging_version="$4" gomod
  mkdir -p "$dir"
  (
    cd "$dir"
    go mod init lockedjob.local/build >/dev/null 2>&1
    gomod="$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [ -n "$gomod" ] || { say "error: go mod download $module@$version gave no go.mod"; exit 1; }
    # Lines like "k8s.io/api => ./staging/src/k8s.io/api" (inside or outside a replace block).
    grep -E '^[[:space:]]*(replace[[:space:]]+)?[^[:space:]]+[[:space:]]+=>[[:space:]]+\.\.?/' "$gomod" \
      | sed -E 's/^[[:space:]]*(replace[[:space:]]+)?//' | awk '{print $1}' | sort -u \
      | while read -r dep; do
          [ "$dep" = "go.etcd.io/etcd" ] || [ "$dep" = "go.etcd.io/tests/v3" ] && continue
          go mod edit -replace "$dep=$dep@$staging_version"
        done
    go mod edit -require "$module@$version"
  )
}

# $1 = directory, $2 = the module's version, $3 = extra ldflags, rest = packages to build.
build_tools() {
  local dir="$1" version="$2" ldflags="$3"; shift 3
  (
    cd "$dir"
    # @version: without it `go get` would move the module to its newest release.
    for pkg in "$@"; do go get -tool "$pkg@$version" >&2; done
    go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/" "$@"
  )
}

step=0; steps=8; started=$(date +%s)
progress() {
  step=$((step + 1))
  say "building $step/$steps: $* ($(( $(date +%s) - started )) s so far; output in $log)"
}
skip() { step=$((step + 1)); }

# The kubernetes scratch module, made once for both of its steps.
kubernetes_module() {
  [ -d "$work/kubernetes" ] && return 0
  staging="v0.${KUBERNETES_VERSION#v1.}"
  say "downloading k8s.io/kubernetes@$KUBERNETES_VERSION (staging modules at $staging)"
  scratch_module "$work/kubernetes" k8s.io/kubernetes "$KUBERNETES_VERSION" "$staging" >>"$log" 2>&1
}
kubernetes_stamp() {
  local minor="${KUBERNETES_VERSION#v1.}" p out=""
  minor="${minor%%.*}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    out+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$out"
}
# go_install NAME VERSION LDFLAGS PACKAGE@VERSION...: modules without local replaces.
go_install() {
  local name="$1" version="$2" ldflags="$3"; shift 3
  GOBIN="$bin" go install -trimpath -ldflags "-s -w $ldflags" "$@" >>"$log" 2>&1
  echo "$version" >"$bin/.$name.version"
}

if ! present control-plane "" "${control_plane[@]}"; then
  progress "${control_plane[*]} $KUBERNETES_VERSION"
  kubernetes_module
  build_tools "$work/kubernetes" "$KUBERNETES_VERSION" "$(kubernetes_stamp)" \
    "${control_plane[@]/#/k8s.io/kubernetes/cmd/}" >>"$log" 2>&1
else skip; fi

if ! present node "" "${node[@]}"; then
  progress "${node[*]} $KUBERNETES_VERSION"
  kubernetes_module
  build_tools "$work/kubernetes" "$KUBERNETES_VERSION" "$(kubernetes_stamp)" \
    "${node[@]/#/k8s.io/kubernetes/cmd/}" >>"$log" 2>&1
else skip; fi

if ! present etcd "" etcd; then
  progress "etcd $ETCD_VERSION"
  scratch_module "$work/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION" >>"$log" 2>&1
  build_tools "$work/etcd" "$ETCD_VERSION" "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
    go.etcd.io/etcd/server/v3 >>"$log" 2>&1
  # go names the binary after the package's directory, "server".
  mv "$bin/server" "$bin/etcd"
else skip; fi

if ! present helm "" helm; then
  progress "helm $HELM_VERSION"
  go_install helm "$HELM_VERSION" "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
else skip; fi

if ! present containerd "$CONTAINERD_VERSION" "${containerd[@]}"; then
  progress "${containerd[*]} $CONTAINERD_VERSION"
  # no_btrfs: the btrfs snapshotter needs cgo and headers; the node uses overlayfs.
  GOFLAGS="$GOFLAGS -tags=no_btrfs" go_install containerd "$CONTAINERD_VERSION" \
    "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    $(for b in "${containerd[@]}"; do echo "github.com/containerd/containerd/v2/cmd/$b@$CONTAINERD_VERSION"; done)
else skip; fi

if ! present coredns "$COREDNS_VERSION" coredns; then
  progress "coredns $COREDNS_VERSION"
  go_install coredns "$COREDNS_VERSION" "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
else skip; fi

if ! present crictl "$CRICTL_VERSION" crictl; then
  progress "crictl $CRICTL_VERSION"
  go_install crictl "$CRICTL_VERSION" "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
else skip; fi
if ! present registry "$DISTRIBUTION_VERSION" registry; then
  progress "registry $DISTRIBUTION_VERSION"
  go_install registry "$DISTRIBUTION_VERSION" \
    "-X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
    "github.com/distribution/distribution/v3/cmd/registry@$DISTRIBUTION_VERSION"
else skip; fi
complete || { say "error: build finished but binaries are missing in $bin"; exit 1; }
say "done in $(( $(date +%s) - started )) s: $(cd "$bin" && echo "${all[*]}")"
echo "$bin"
