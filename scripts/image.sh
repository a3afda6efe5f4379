#!/usr/bin/env bash
# Builds the operator image from the Dockerfile with buildah: no Docker engine, nothing pulled
# from an image registry. The two base images the Dockerfile names are made here first:
#   rust:1-bookworm                     Debian bookworm (debootstrap, from Debian's packages)
#                                       with gcc and this machine's Rust toolchain, as the
#                                       official image lays it out (/usr/local/cargo)
#   gcr.io/distroless/cc-debian12:nonroot
#                                       what distroless/cc holds, from the same packages:
#                                       glibc, libgcc, libstdc++, libgomp, libssl, CA
#                                       certificates, tzdata, user nonroot (65532), no shell
# then `buildah bud` runs the Dockerfile unchanged (its build stage fetches crates from
# crates.io, so it runs on the host's network). Layers are cached: with the Dockerfile,
# Cargo.toml and Cargo.lock unchanged only the project is compiled again.
#
# Usage: scripts/image.sh [--tag NAME] [--out FILE]
#   --tag  the image's name (default: ghcr.io/lockedjob/lockedjob-operator:<the chart's appVersion>)
#   --out  where to write the image as a docker archive (default: in the cache); the last line
#          of stdout is that path, so `archive=$(scripts/image.sh | tail -n1)` works.
# Cache: $LOCKEDJOB_IMAGE_CACHE (default ~/.cache/lockedjob/images): buildah's storage, the
# build log. Mirror: $LOCKEDJOB_DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs root.
# $LOCKEDJOB_IMAGE_CPU_SHARES: the build containers' CPU weight (buildah --cpu-shares; default
# 1024). A container is a cgroup of its own, beyond nice's reach: scripts/test.sh sets 2 so
# that the build yields to the tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"

say() { printf '[image] %s\n' "$*" >&2; }

app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/lockedjob-operator/Chart.yaml")"
tag="ghcr.io/lockedjob/lockedjob-operator:$app_version"
cache="${LOCKEDJOB_IMAGE_CACHE:-$HOME/.cache/lockedjob/images}"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    *) say "error: unknown argument $1 (usage: scripts/image.sh [--tag NAME] [--out FILE])"; exit 2 ;;
  esac
done
out="${out:-$cache/lockedjob-operator.tar}"

if [ "$(id -u)" -ne 0 ]; then
  say "error: buildah and debootstrap need root here"
  exit 1
fi
"$here/deps.sh" buildah debootstrap
command -v rustc >/dev/null || { say "error: no rustc on PATH: the build stage uses this machine's toolchain"; exit 1; }

# The Dockerfile's base image names.
rust_image="docker.io/library/rust:1-bookworm"
distroless_image="gcr.io/distroless/cc-debian12:nonroot"
suite="bookworm"
mirror="${LOCKEDJOB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Packages distroless/cc-debian12 is made of (its base adds /etc/passwd and the CA bundle).
distroless_packages=(libc6 libgcc-s1 libgomp1 libstdc++6 libssl3 tzdata)

mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9 # one build at a time per cache: buildah's layer cache is shared
work="$(mktemp -d)"
log="$cache/build.log"
: >"$log"
# buildah's run state lives with this run: nothing stays mounted or recorded under /run.
storage=(--root "$cache/storage" --runroot "$work/run" --storage-driver overlay)
b() { buildah "${storage[@]}" "$@"; }
finish() {
  local status=$?
  b rm --all >/dev/null 2>&1 || true
  # debootstrap mounts /proc and /sys in its target while it runs; never delete through them.
  findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount -l || true
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then
    say "error: the build failed (exit $status); the last lines of $log:"
    tail -n 40 "$log" >&2
  fi
}
trap finish EXIT
started=$(date +%s)
progress() { say "$* ($(( $(date +%s) - started )) s so far; output in $log)"; }

# --- The base images, made again when the toolchain or this recipe changes. ---
base_recipe=3
base_key="$suite $base_recipe $(rustc -vV | tr '\n' ' ') $(cat /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-16)"
base_present() {
  [ "$(cat "$cache/base.stamp" 2>/dev/null)" = "$base_key" ] \
    && b inspect --type image "$rust_image" >/dev/null 2>&1 \
    && b inspect --type image "$distroless_image" >/dev/null 2>&1
}

root_file_system() {
  progress "debootstrap $suite from $mirror"
  debootstrap --variant=minbase --include=gcc,libc6-dev,ca-certificates,tzdata \
    "$suite" "$work/root" "$mirror" >>"$log" 2>&1
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
}

# Laid out as the official rust image is (RUSTUP_HOME, CARGO_HOME, cargo on PATH), the
# toolchain being the one `rustc` here runs; its documentation is left out. It trusts the CAs
# this machine adds (/usr/local/share/ca-certificates), as a build image behind a
# TLS-inspecting proxy must, to fetch crates; the final image holds Debian's bundle only.
rust_base() {
  local sysroot version toolchain c
  sysroot="$(rustc --print sysroot)"
  version="$(rustc -V | awk '{print $2}')"
  toolchain="/usr/local/rustup/toolchains/$version-x86_64-unknown-linux-gnu"
  progress "$rust_image: Debian $suite with gcc and Rust $version"
  tar -C "$work/root" -cf "$work/root.tar" .
  c="$(b from --pull=never scratch)"
  {
    b add "$c" "$work/root.tar" /
    b copy "$c" "$sysroot/bin" "$toolchain/bin"
    b copy "$c" "$sysroot/lib" "$toolchain/lib"
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
      b copy "$c" /usr/local/share/ca-certificates /usr/local/share/ca-certificates
      b run "$c" -- update-ca-certificates
    fi
    b run "$c" -- sh -ec "mkdir -p /usr/local/cargo/bin && for p in cargo rustc rustdoc; do ln -s $toolchain/bin/\$p /usr/local/cargo/bin/\$p; done"
    b config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
      --env RUST_VERSION="$version" \
      --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd bash "$c"
    b commit --rm -q "$c" "$rust_image"
  } >>"$log" 2>&1
}

# The files of the packages (their dpkg lists, /lib... written as /usr/lib... where Debian has
# merged /usr), the CA bundle, os-release, and nonroot's passwd, group and home.
distroless_tree() {
  local tree="$work/distroless" root="$work/root" pkg list
  mkdir -p "$tree/etc/ssl/certs" "$tree/home/nonroot" "$tree/tmp" "$tree/usr/lib"
  for link in bin lib lib64 sbin; do ln -s "usr/$link" "$tree/$link"; done
  for pkg in "${distroless_packages[@]}"; do
    list="$root/var/lib/dpkg/info/$pkg:amd64.list"
    [ -f "$list" ] || list="$root/var/lib/dpkg/info/$pkg.list"
    [ -f "$list" ] || { say "error: $pkg is not in the $suite root file system"; return 1; }
    sed -E 's#^/(bin|lib|lib64|sbin)/#/usr/\1/#' "$list" | while read -r path; do
      [ -e "$root$path" ] || [ -L "$root$path" ] || continue
      [ -d "$root$path" ] && [ ! -L "$root$path" ] && continue
      mkdir -p "$tree$(dirname "$path")"
      cp -a "$root$path" "$tree$path"
    done
  done
  cp "$root/etc/ssl/certs/ca-certificates.crt" "$tree/etc/ssl/certs/"
  cp "$root/usr/lib/os-release" "$tree/usr/lib/"
  ln -s ../usr/lib/os-release "$tree/etc/os-release"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$tree/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$tree/etc/group"
  printf 'hosts: files dns\n' >"$tree/etc/nsswitch.conf"
  chown 65532:65532 "$tree/home/nonroot"
  chmod 1777 "$tree/tmp"
}

distroless_base() {
  local c
  progress "$distroless_image: ${distroless_packages[*]}, CA certificates, user 65532"
  distroless_tree
  tar -C "$work/distroless" -cf "$work/distroless.tar" .
  c="$(b from --pull=never scratch)"
  {
    b add "$c" "$work/distroless.tar" /
    b config --user 65532:65532 --workingdir /home/nonroot \
      --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "$c"
    b commit --rm -q "$c" "$distroless_image"
  } >>"$log" 2>&1
}

if base_present; then
  say "base images cached: $rust_image, $distroless_image"
else
  root_file_system
  rust_base
  distroless_base
  echo "$base_key" >"$cache/base.stamp"
fi

# --- The Dockerfile. ---
# The build stage is tagged too, so pruning below keeps its cached layers (dependencies
# compiled) and drops only what earlier builds left.
build_stage="localhost/lockedjob-operator-build:cache"
bud() {
  b bud --pull=never --layers --network=host --cpu-shares "${LOCKEDJOB_IMAGE_CPU_SHARES:-1024}" \
    -f "$repo/Dockerfile" "$@" "$repo" >>"$log" 2>&1
}
progress "buildah bud $repo/Dockerfile -> $tag (a cold release build takes about 10 minutes on 2 cores)"
bud --target build --tag "$build_stage"
bud --tag "$tag"
# Each layer an earlier build left has no name and no child once the newer one is tagged.
for _ in 1 2 3 4 5 6 7 8; do
  [ -n "$(b images --quiet --filter dangling=true 2>/dev/null)" ] || break
  b rmi --prune >>"$log" 2>&1 || break
done

id="$(b inspect --type image --format '{{.FromImageID}}' "$tag")"
# The archive is written again only when it holds another image or name.
if [ "$(cat "$out.id" 2>/dev/null)" != "$tag $id" ] || [ ! -f "$out" ]; then
  rm -f "$out"
  b push -q "$tag" "docker-archive:$out:$tag" >>"$log" 2>&1
  echo "$tag $id" >"$out.id"
fi
say "$tag, image ${id:0:12}: $out ($(( $(date +%s) - started )) s)"
echo "$out"
