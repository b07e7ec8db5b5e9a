#!/usr/bin/env bash
# Install everything guardctl's demo and tests need on a fresh Debian 12 machine (run as root):
# Slurm and munge from the distribution, mmdebstrap (the lab builds Debian roots with it to run
# the Slurm-facing tests on Slurm 24.11 and 26.05 too), man, Chromium (the HTML report test),
# Prometheus (the Prometheus-source tests start their own server), strace (the filesystem-load
# benchmark counts the writers' calls with it), and guardctl itself with its
# development extras. Idempotent: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(slurm-wlm munge mmdebstrap man-db chromium prometheus strace)
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[dev]'
# guardctl[torch]'s tests (tests/torch) run real DDP jobs on CPU: the CPU build, pinned (a plain
# `torch` would pull the multi-GB CUDA build; the GPU checks live in tools/).
python3 -m pip install -q --disable-pip-version-check torch==2.13.0
# guardctl[lightning]'s callback is tested in a real Lightning DDP job (after torch: it keeps
# the CPU build, which satisfies it).
python3 -m pip install -q --disable-pip-version-check lightning==2.6.6
# guardctl[accelerate]'s recipe is tested in a real Accelerate job. Pinned with the click and
# torch already installed: a plain `accelerate` takes the newest huggingface_hub (2.4.0), which
# wants click>=8.4.2 and would upgrade click 8.4.0; huggingface_hub 1.21.0 is the newest that
# keeps it.
click_now=$(python3 -c 'import importlib.metadata as m; print(m.version("click"))')
python3 -m pip install -q --disable-pip-version-check accelerate==1.16.0 huggingface_hub==1.21.0 \
    "click==$click_now" torch==2.13.0
echo "setup: done ($(python3 -m guardctl --version))" >&2
