#!/usr/bin/env bash
# Quickstart, the README's first command.
#   scripts/quickstart.sh         the operator doing its job: two local Kubernetes clusters
#                                 (real control planes and a real node each, built from Go
#                                 modules; the first run builds them, ~15 minutes, with progress
#                                 lines; needs root) sharing 5 local Redis nodes, `helm install`
#                                 of 3 replicas in each, one LockedJob every 10 s in both; midway the holder's pod is deleted and one
#                                 Redis node killed; prints every run, `kubectl get lj` of both
#                                 clusters and a verdict (QUICKSTART_SECONDS, default 60)
#   scripts/quickstart.sh exec    `lockedjob exec`: 5 local Redis nodes, 3 contending runners for
#                                 ~20 s, one node killed midway; prints each run and a verdict
set -euo pipefail
cd "$(dirname "$0")/.."

operator_demo() {
  scripts/deps.sh redis-server runc containernetworking-plugins iptables busybox-static
  echo "[quickstart] control plane binaries (scripts/k8s-bins.sh)" >&2
  LOCKEDJOB_K8S_BIN="$(scripts/k8s-bins.sh | tail -n1)"
  export LOCKEDJOB_K8S_BIN
  echo "[quickstart] building lockedjob and the quickstart (cargo)" >&2
  cargo build --quiet --locked --bin lockedjob
  cargo build --quiet --locked -p quickstart
  QUICKSTART_LOCKEDJOB="$PWD/target/debug/lockedjob" exec target/debug/quickstart
}

case "${1:-operator}" in
  operator) operator_demo ;;
  exec) ;;
  *) echo "usage: scripts/quickstart.sh [operator|exec]" >&2; exit 2 ;;
esac

scripts/deps.sh redis-server
cargo build --quiet --bin lockedjob
bin="$PWD/target/debug/lockedjob"
seconds="${QUICKSTART_SECONDS:-20}"

work="$(mktemp -d -t lockedjob-quickstart.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

urls=()
node_pids=()
port=$((20000 + RANDOM % 20000))
for i in 1 2 3 4 5; do
  while ! port_free "$port"; do port=$((port + 1)); done
  mkdir -p "$work/node$i"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$work/node$i" --save "" \
    --appendonly yes --appendfsync always --daemonize no --logfile "$work/node$i/redis.log" &
  pids+=($!); node_pids+=($!)
  urls+=("redis://127.0.0.1:$port")
  port=$((port + 1))
done
export LOCKEDJOB_REDIS_URLS
LOCKEDJOB_REDIS_URLS="$(IFS=,; echo "${urls[*]}")"
for url in "${urls[@]}"; do
  p="${url##*:}"
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
done
echo "5 Redis nodes up: $LOCKEDJOB_REDIS_URLS"

journal="$work/journal"
: >"$journal"
end_at=$(( $(date +%s) + seconds ))
for r in 1 2 3; do
  (
    while [ "$(date +%s)" -lt "$end_at" ]; do
      # Each run records its start and end (epoch seconds) and its token while holding the lock.
      "$bin" exec --lock quickstart --ttl 5s --wait 10s --cluster-id quickstart --runner-name "runner-$r" -- \
        sh -c 'start=$(date +%s.%N); sleep 0.4; end=$(date +%s.%N); echo "$LOCKEDJOB_HOLDER $LOCKEDJOB_FENCING_TOKEN $start $end" >>"$0"' "$journal" \
        2>>"$work/exec.log" || true
      sleep "0.$((RANDOM % 4))" # let the others in: a loop that re-acquires at once starves them
    done
  ) &
  pids+=($!)
done

sleep $((seconds / 2))
echo "killing one Redis node (kill -9): ${urls[2]}"
{ kill -9 "${node_pids[2]}"; wait "${node_pids[2]}"; } 2>/dev/null || true
wait_for_runners() { for pid in "${pids[@]:5}"; do wait "$pid" 2>/dev/null || true; done; }
wait_for_runners

echo
printf '%-24s %6s  %-12s  %-12s\n' "runner" "token" "start" "end"
sort -k3,3n "$journal" | awk '
  function clock(t,  s) { s = int(t); return strftime("%H:%M:%S", s) sprintf(".%03d", (t - s) * 1000) }
  {
    printf "%-24s %6d  %-12s  %-12s\n", $1, $2, clock($3), clock($4)
    if (NR > 1 && $3 < last_end) { overlaps++ }
    if (NR > 1 && $2 <= last_token) { disorder++ }
    last_end = $4; last_token = $2; runs++
  }
  END {
    printf "\n%d runs, %d overlapping, %d out of token order\n", runs, overlaps, disorder
    if (runs == 0 || overlaps > 0 || disorder > 0) { print "FAILED"; exit 1 }
    print "OK: one runner at a time, tokens growing"
  }'
