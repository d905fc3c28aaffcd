#!/usr/bin/env bash
# GLM-4.5-Air on one 24 GB GPU: layers 0-9 on the GPU, other experts in RAM.
set -euo pipefail
MODEL=/models/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf

exec ./build/bin/llama-server -m "$MODEL" \
  -ngl 999 \
  -ot "blk\.[0-9]=CUDA0, exps=CPU" \
  --host 0.0.0.0 --port 8080
