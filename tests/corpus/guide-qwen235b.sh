#!/bin/sh
# Copied from a guide whose web page ate the ".*": matches nothing.
llama-server -m /models/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf -ngl 999 -fit off \
  -ot "blk.(?:[0-9]|[1-7][0-9]|[8][0-7]).ffn._exps.=CPU"
