#!/usr/bin/env bash
# The project's test command: set up a fresh machine, then lint, type-check and run every test
# (unit tests and the tests against a real local Slurm, which the test harness starts itself).
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh
echo "== ruff" && python3 -m ruff check .
echo "== mypy" && python3 -m mypy
echo "== pytest" && python3 -m pytest -q -p no:cacheprovider "$@"
