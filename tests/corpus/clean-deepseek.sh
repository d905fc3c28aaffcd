#!/bin/sh
# A careful launch: every layer offloaded, routed experts of layers 7-60 in RAM, fit off.
exec llama-server -m /models/DeepSeek-V3-0324-Q4_K_M-00001-of-00009.gguf -ngl 999 -fit off -c 32768 \
  -ot 'blk\.(\d\d|[7-9])\..*exps=CPU'
