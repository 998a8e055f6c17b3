#!/usr/bin/env bash
# Creates the project venv (.venv) with kvgate, its lab extras and its dev tools. Idempotent: a second run only
# checks.
#   scripts/bootstrap.sh          the venv only (what scripts/up.sh needs)
#   scripts/bootstrap.sh --test   also Debian's prometheus for the dashboard query test, when running as root
#                                 (scripts/test.sh, so CI, passes this)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
with_test_tools=0
case "${1:-}" in
  --test) with_test_tools=1 ;;
  "") ;;
  *) echo "usage: scripts/bootstrap.sh [--test]" >&2; exit 2 ;;
esac
stamp=.venv/.kvgate-installed
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Reinstall when pyproject.toml changed since the last install.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install --quiet --upgrade pip </dev/null
  .venv/bin/pip install --quiet -e '.[all,dev]' </dev/null
  touch "$stamp"
fi
if [ "$with_test_tools" = 1 ] && ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1; then
  echo "bootstrap: installing Debian's prometheus (used by the dashboard query test)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
    </dev/null >/dev/null 2>&1 || echo "bootstrap: prometheus install failed; its test will say so" >&2
fi
