#!/usr/bin/env bash
# Static security checks of terraform/ with checkov, in its own virtual environment.
#
# checkov pins versions that conflict with the application's dependencies, so it lives in
# .venv-checkov, never in .venv. The venv is reused when it already holds the pinned version.
# Exits non-zero when any check fails; accepted exceptions are inline `#checkov:skip=` comments
# in the Terraform, each with its reason.
set -euo pipefail

CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CHECKOV_VENV:-$ROOT/.venv-checkov}"

installed_version() {
  "$VENV/bin/checkov" --version 2>/dev/null | tail -n 1 || true
}

if [[ "$(installed_version)" != "$CHECKOV_VERSION" ]]; then
  echo "checkov.sh: installing checkov==$CHECKOV_VERSION into $VENV" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
  "$VENV/bin/pip" install -q "checkov==$CHECKOV_VERSION"
fi

cd "$ROOT"
# Offline and deterministic: no Prisma Cloud mapping download, no external module download.
export BC_SKIP_MAPPING=TRUE
export CHECKOV_RUN_SCA_PACKAGE_SCAN_V2=false
exec "$VENV/bin/checkov" \
  -d terraform/ \
  --framework terraform \
  --download-external-modules false \
  --skip-download \
  --quiet \
  --compact \
  "$@"
