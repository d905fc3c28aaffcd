#!/bin/sh
# moeconf: engine=ik_llama.cpp
/opt/ik_llama.cpp/build/bin/llama-server -m /models/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf \
  -ngl 999 --n-cpu-moe 60 -mqkv -sm graph
