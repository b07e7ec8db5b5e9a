#!/usr/bin/env bash
# The project's test command: set up a fresh machine, then lint, check the format, type-check,
# check the import rules and run every test
# (unit tests and the tests against a real local Slurm, which the test harness starts itself)
# on the host's Slurm, then the Slurm-facing tests (marker `slurm`) again on each other release
# in GUARDCTL_LAB_RELEASES (default: those of 22.05, 24.11 and 26.05 that the host does not
# run; each in a Debian root, see slurm/lab/README.md). Ends with one summary line per release.
# Arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh
echo "== ruff" && python3 -m ruff check . && python3 -m ruff format --check .
echo "== mypy" && python3 -m mypy
echo "== import rules" && lint-imports --no-cache

host=$(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null | sed -n 's/^\([0-9]*\.[0-9]*\).*/\1/p')
others=${GUARDCTL_LAB_RELEASES-$(printf '%s\n' 22.05 24.11 26.05 | grep -vxF "${host:-22.05}" | tr '\n' ' ')}

summary=()
failed=0
# run_pytest LABEL RELEASE PYTEST-ARGS...: one pytest run, its last line kept for the summary.
run_pytest() {
    local label=$1 release=$2 log start rc=0
    shift 2
    log=$(mktemp)
    start=$SECONDS
    echo "== pytest: $label"
    GUARDCTL_LAB_RELEASE=$release python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$log" ||
        rc=$?
    summary+=("Slurm ${release:-$host} ($label): $(grep -E ' in [0-9.]+s' "$log" | tail -n 1 | tr -d '=' |
        sed 's/^ *//;s/ *$//') [rc $rc, $((SECONDS - start)) s]")
    rm -f "$log"
    ((rc == 0 || rc == 5)) || failed=1 # 5: no test selected (e.g. -m slurm of a unit test file)
}

run_pytest "all tests" "" "$@"
for release in $others; do
    run_pytest "Slurm-facing tests" "$release" -m slurm "$@"
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
