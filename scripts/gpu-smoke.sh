#!/usr/bin/env bash
# Read-only smoke run of gpud on a real NVIDIA machine (one GPU is enough).
#   scripts/gpu-smoke.sh OUTDIR
# It installs gpud (and the probe's torch if missing) into a throw-away venv, then runs doctor,
# status, topo, metrics, a one-GPU probe, the probe's one-GPU CUDA parts directly (DDP, the
# pipeline's baselines, P2P on one GPU) and its CUDA-path tests, a two-GPU probe (DDP, all-reduce
# over NCCL, a 2-stage pipeline, P2P both ways) where the machine has two GPUs, and an apply
# --dry-run, saving each output in OUTDIR.
# It changes NO GPU setting: no apply, no restore, no daemon; clocks, power, fans, persistence
# and compute mode stay exactly as they are.
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export GPUD_STATE_DIR="$(mktemp -d)" PYTHONUNBUFFERED=1 NO_COLOR=1
venv="${GPUD_SMOKE_VENV:-$(mktemp -d)/venv}"
log() { printf '== %s\n' "$*" | tee -a "$out/summary.txt"; }

python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1 || python3 -m venv "$venv"
"$venv/bin/pip" install -q -e . >"$out/install.txt" 2>&1 || { log "install failed"; exit 1; }
"$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/pip" install -q torch numpy >>"$out/install.txt" 2>&1
gpud="$venv/bin/gpud"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >"$out/nvidia-smi-topo.txt" 2>&1
nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1

run() {  # name, then the command; records exit code and wall time
  local name="$1"; shift
  local t0=$EPOCHREALTIME
  "$@" >"$out/$name" 2>"$out/$name.err"
  local rc=$?
  log "$name: exit $rc, $(awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $t0 }") s"
}
run doctor.json "$gpud" doctor --json
run doctor.txt "$gpud" doctor
run status.json "$gpud" status --json
run status.txt "$gpud" status
run topo.txt "$gpud" topo
run metrics.txt "$gpud" metrics
command -v promtool >/dev/null && promtool check metrics <"$out/metrics.txt" >"$out/promtool.txt" 2>&1
run apply-dry-run.txt "$gpud" apply training --dry-run
run ps.json "$gpud" ps --json
# The driver's own view, to compare with gpud's readings (violation counters, NVLink data, processes)
# and to make a simulated twin of this machine (read-only queries).
run nvidia-smi-q.txt nvidia-smi -q
run nvidia-smi-topo.txt nvidia-smi topo -m
run nvidia-smi-nvlink-gt.txt nvidia-smi nvlink -gt d
run sim-import.toml "$gpud" sim import "$out/nvidia-smi-q.txt" --topo "$out/nvidia-smi-topo.txt"
run probe.json "$gpud" probe --gpus 1 --quick --json
run probe.txt "$gpud" probe --gpus 1 --quick
# The probe's one-GPU CUDA parts, each rank function run directly on GPU0 (read-only: it only computes):
# DDP on one GPU (bf16 or fp16 autocast), the pipeline's unsplit baseline and its naive split in fp32,
# and the P2P task's answer on one GPU; then the CUDA-path tests, which also run without a GPU.
printf '{"device": "cuda", "tasks": ["ddp", "pipeline_baseline", "p2p"], "quick": true, "stages": [2], "out": "%s"}\n' \
  "$out/worker-1gpu.json" >"$out/worker-1gpu.spec.json"
run worker-1gpu.txt env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" \
  "$venv/bin/python" -m gpud.probe.worker "$out/worker-1gpu.spec.json"
"$venv/bin/python" -c "import pytest" 2>/dev/null || "$venv/bin/pip" install -q pytest >>"$out/install.txt" 2>&1
run probe-cuda-paths.txt "$venv/bin/python" -m pytest -q tests/test_probe_cuda_paths.py -p no:cacheprovider
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -ge 2 ]; then
  run probe-2gpu.json "$gpud" probe --gpus 2 --world-sizes 2 --quick --json
  run probe-2gpu.txt "$gpud" probe --gpus 2 --world-sizes 2 --quick
else
  log "probe-2gpu: skipped ($gpus GPU)"
fi
log "done: $(ls "$out" | wc -l) files in $out"
