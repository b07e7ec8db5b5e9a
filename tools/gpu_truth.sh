#!/usr/bin/env bash
# The three GPU truth checks on one GPU node, in one go (about three minutes):
#   - the agent's NVML readings against nvidia-smi (tools/gpu_truth_agent.py), over a window
#     that holds idle, a full GEMM load and idle again, so clocks, power, temperature and
#     utilisation are compared where they move;
#   - the gemm sweep program's TFLOP/s against the card's achievable figure
#     (tools/gpu_truth_gemm.py), run inside that window as the load;
#   - the probe's CUDA-event mode against the GPU's own events and the host's clock
#     (tools/gpu_truth_probe.py).
# Each check writes OUTDIR/NAME.json (and NAME.err); the summary line gives each exit status
# (0 agrees, 1 mismatch, 2 could not run). Exit status: the worst of the three.
#
#   tools/gpu_truth.sh [OUTDIR]      (default: ./gpu-truth; PYTHON=... to pick the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-truth}
py=${PYTHON:-python3}
mkdir -p "$out"

nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit --format=csv \
    >"$out/gpus.csv" 2>&1 || { echo "gpu_truth: nvidia-smi failed: $(cat "$out/gpus.csv")" >&2; exit 2; }
"$py" -c 'import torch; print(torch.__version__, torch.version.cuda)' >"$out/torch.txt" 2>&1

"$py" tools/gpu_truth_agent.py --seconds 110 --json >"$out/agent.json" 2>"$out/agent.err" &
agent=$!
sleep 20  # idle readings first
"$py" tools/gpu_truth_gemm.py --duration 60 --json >"$out/gemm.json" 2>"$out/gemm.err"
gemm_rc=$?
wait "$agent"
agent_rc=$?
"$py" tools/gpu_truth_probe.py --json >"$out/probe.json" 2>"$out/probe.err"
probe_rc=$?

echo "gpu_truth: agent $agent_rc, gemm $gemm_rc, probe $probe_rc (results in $out)"
worst=0
for rc in "$agent_rc" "$gemm_rc" "$probe_rc"; do
    ((rc > worst)) && worst=$rc
done
exit "$worst"
