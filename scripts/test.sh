#!/usr/bin/env bash
# Runs every check and test, as CI does. Installs what the tests need when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh redis-server
# The bundled redis-server service is not used: tests start their own nodes on free ports.
command -v redis-server >/dev/null
# Kubernetes' OpenAPI schemas, offline, for the manifest checks in tests/chart.rs.
if ! python3 -m kubernetes_validate --version >/dev/null 2>&1; then
  echo "installing kubernetes-validate (PyPI)" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore kubernetes-validate \
    || echo "warning: kubernetes-validate could not be installed; tests/chart.rs will say it skipped" >&2
fi

# Said here, not only inside the tests (cargo test hides their output when they pass).
command -v helm >/dev/null || echo "skipped: helm not installed (helm lint / helm template of charts/ not run)"
command -v kubectl >/dev/null || echo "skipped: kubectl not installed (tests/kubectl.rs does not apply the manifests)"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== benchmark smoke pass (cargo bench runs it in full)"
cargo test --locked --bench redlock
cargo test --locked --bench operator
echo "== cargo test"
cargo test --locked --lib --bins --tests
