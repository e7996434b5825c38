#!/usr/bin/env bash
# The trainer at real model shapes on one CUDA GPU (issue 23): one bf16 `Trainer.step` of 4 samples
# at Qwen2.5-0.5B's and Qwen2.5-1.5B's full configurations (random init, nothing downloaded), response
# lengths 1k / 4k / 8k, chunked vs full-logit LM head: peak memory, tokens/s, MFU; then packed vs padded
# vs TRL tokens/s and MFU on a long-tailed batch of 16 responses up to 4k tokens. Needs a Python with
# CUDA torch and scalerl (pip install -e .); PYTHON picks the interpreter. About 5 minutes on an H200.
#
#     bash benchmarks/gpu/run_real_shape_gpu.sh 2>&1 | tee real_shape_gpu.txt
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"; then
  echo "run_real_shape_gpu: needs CUDA torch on a GPU machine" >&2
  exit 2
fi
timeout --signal=INT 900 "$PY" benchmarks/gpu/real_shape_gpu.py "$@"
