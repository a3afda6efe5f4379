#!/usr/bin/env bash
# Runs every libFuzzer target in fuzz/ for SECONDS each (default 60) and prints how many
# inputs each ran. Needs the nightly toolchain; installs cargo-fuzz from crates.io if missing.
# A crash leaves its input in fuzz/artifacts/<target>/ and fails this script.
#   scripts/fuzz.sh            # 60 s a target
#   scripts/fuzz.sh 600 cron   # one target, 10 minutes
set -euo pipefail
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(cron spec redis_url run_now)
case "$seconds" in
  ''|*[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 64 ;;
esac
cd "$(dirname "$0")/../fuzz"
rustup toolchain list | grep -q '^nightly' || { echo "fuzz.sh: needs the nightly toolchain (rustup toolchain install nightly)" >&2; exit 69; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  log="$(mktemp)"
  if ! cargo +nightly fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
      -max_total_time="$seconds" -max_len=4096 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz.sh: $target found a failing input (fuzz/artifacts/$target/)" >&2
    exit 1
  fi
  runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | grep -Eo '[0-9]+' || echo "?")
  corpus=$(ls "corpus/$target" | wc -l)
  printf '%-10s %10s inputs in %ss, corpus %s\n' "$target" "$runs" "$seconds" "$corpus"
  rm -f "$log"
done
