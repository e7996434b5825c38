#!/usr/bin/env bash
# vLLM and FSDP2 on one CUDA GPU, in about 10 minutes on an H200 (each phase has its own time limit;
# phases 1-5 take at most 10.5, their limits summed):
#   1. the vLLM tests (tests/with_vllm) on CUDA: they take their device from vLLM's platform;
#   2. vLLM tokens/s inside `scalerl train` (pipeline mode) against bare vLLM, on a random-init model
#      with Qwen2.5-0.5B's configuration (no hub access);
#   3. the bf16 train/inference mismatch with and without the FP32 LM head (and float32);
#   4. colocated sleep/wake (generation.vllm.colocate) at the 0.5B shape: device memory freed by
#      sleep (levels 1 and 2), sleep / wake seconds, and the weight handoff of the trainer's device
#      tensors against the host-copy path;
#   5. CUDA graphs on/off (generation.vllm.enforce_eager false/true): start-up seconds and tokens/s;
#   6. (with Ray installed: pip install -e ".[distributed]") a 1-rank FSDP2 trainer on CUDA exporting its
#      weights into engine actors (embedded and vLLM) on the same GPU: tests/distributed/test_ray_gpu.py;
#   7. (2+ GPUs and Ray) weight-sync seconds of the 0.5B / 1.5B layer stacks, NCCL streamed from the
#      FSDP2 shard against the object store (benchmarks/bench_scaleout.py --weight-sync-gpus).
# Needs a Python with CUDA torch, `vllm==0.32.*` and scalerl installed (pip install -e ".[vllm]" pytest
# pytest-timeout); PYTHON picks the interpreter. Prints everything; exits non-zero if a phase failed.
#
#     bash benchmarks/gpu/run_vllm_gpu.sh 2>&1 | tee vllm_gpu.txt
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
status=0

if ! "$PY" - <<'PYCHECK'
import sys
import torch
from scalerl.rollout.factory import check_engine_available
check_engine_available("vllm")
from vllm.platforms import current_platform
print(f"torch {torch.__version__}, vLLM platform {current_platform.device_type}, "
      f"CUDA {torch.cuda.is_available()} ({torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'})")
sys.exit(0 if current_platform.device_type == "cuda" else 3)
PYCHECK
then
  echo "run_vllm_gpu: needs vLLM 0.32 on a CUDA GPU (pip install -e '.[vllm]' pytest pytest-timeout)" >&2
  exit 2
fi

phase() {  # phase NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s)"
  timeout --signal=INT "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $(( $(date +%s) - t0 ))s"
  [ $rc -eq 0 ] || status=1
}

phase "vLLM tests on CUDA" 240 "$PY" -m pytest -q -x tests/with_vllm -p no:cacheprovider
phase "tokens/s in training vs bare vLLM" 120 "$PY" benchmarks/gpu/vllm_gpu.py throughput --size 0.5b
phase "bf16 mismatch, FP32 head on/off" 90 "$PY" benchmarks/gpu/vllm_gpu.py mismatch --size 0.5b --steps 3
phase "colocated sleep/wake and weight handoff" 90 "$PY" benchmarks/gpu/vllm_gpu.py colocate --size 0.5b \
  --batch-size 64 --prompts 16 --max-new-tokens 64
phase "CUDA graphs on/off: start-up s, tok/s" 120 "$PY" benchmarks/gpu/vllm_gpu.py graphs --size 0.5b \
  --batch-size 64 --prompts 16 --max-new-tokens 128
if "$PY" -c "import ray" 2>/dev/null; then
  phase "FSDP2 rank on CUDA -> engine actors" 150 "$PY" -m pytest -q -m distributed -p no:cacheprovider \
    tests/distributed/test_ray_gpu.py
else
  echo "=== FSDP2 rank on CUDA -> engine actors: skipped (Ray not installed: pip install -e '.[distributed]')"
fi
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$gpus" -ge 2 ] && "$PY" -c "import ray" 2>/dev/null; then
  phase "weight sync 0.5B/1.5B layer stacks: NCCL streamed vs object store" 240 "$PY" benchmarks/bench_scaleout.py \
    --weight-sync-only --weight-sync-gpus --weight-sync-sizes 0.5B-layers,1.5B-layers
else
  echo "=== weight sync over NCCL: skipped (needs 2 GPUs and Ray; this machine has $gpus)"
fi
echo "run_vllm_gpu: total $(( $(date +%s) - start ))s, status $status"
exit $status
