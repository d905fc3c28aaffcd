#!/bin/sh
# moeconf: gpus=CUDA0+CUDA1
llama-server -m /models/DeepSeek-V3-0324-Q4_K_M-00001-of-00009.gguf -ngl 999 -fit off \
  -ot "blk\.([0-9])\.=CUDA0,blk\.(1[0-9])\.=CUDA1,exps=CPU" \
  -ot "exps=CPU"
