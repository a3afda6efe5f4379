#!/usr/bin/env bash
# Runs every check and test, as CI does. Installs what the tests need when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh redis-server faketime
# The bundled redis-server service is not used: tests start their own nodes on free ports.
command -v redis-server >/dev/null

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== benchmark smoke pass (cargo bench runs it in full)"
cargo test --locked --bench redlock
echo "== cargo test"
cargo test --locked --lib --bins --tests
