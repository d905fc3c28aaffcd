#!/usr/bin/env bash
# On a lent GPU machine (the device tool; see ../shared/cuda.md): build ik_llama.cpp's llama-server
# with CUDA from the pinned PyPI source package, then measure it with measure_server.py.
#
#   bash scripts/gpu/ik-cuda.sh BUILD_LIMIT_S DEADLINE_S CASE...
#
# Needs, carried in .gpu/: ik-src.tar.xz (ik-llama-cpp-python 0.1.5's vendor/ik_llama.cpp, with
# common/build-info.cpp written, models/docs/tests dropped) and wheels/ (gguf, pyyaml, tqdm).
# Seen on the H200 (16 cores), 2026-11-28: 261 of 307 build steps in 522 s. Do not turn
# GGML_IQK_FLASH_ATTENTION off: 0.1.5's libggml still calls iqk_flash_attn_noalibi and
# iqk_fa_work_buffer_size, and llama-server fails to link.
# The build goes to build/ik-cuda (git-ignored); a second call on the same warm machine resumes it.
# Everything measured goes to $OUT (results.json, logs/, build-tail.log, nvidia-smi.txt).
set -u
t0=$(date +%s)
limit="$1"; deadline=$((t0 + $2)); shift 2
out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
nproc >> "$out/nvidia-smi.txt"
root="$PWD"
sp=$(python3 -c "import site; print(' '.join(site.getsitepackages()))")
lib=$(find $sp -name libcublas.so.13 2>/dev/null | head -1)
CB=$(dirname "$lib")
echo "cublas: $CB" >> "$out/nvidia-smi.txt"
mkdir -p build
[ -d build/ik-src/ik_llama.cpp ] || { mkdir -p build/ik-src && tar -xJf .gpu/ik-src.tar.xz -C build/ik-src; }
src="$root/build/ik-src/ik_llama.cpp"
# the package lacks the build-info generator the build still runs: a no-op one (build-info.cpp is written)
mkdir -p "$src/common/cmake"
[ -f "$src/common/cmake/build-info-gen-cpp.cmake" ] || echo '# build-info.cpp is written by hand' > "$src/common/cmake/build-info-gen-cpp.cmake"
bin="$root/build/ik-cuda/bin/llama-server"
if [ ! -x "$bin" ]; then
  if [ ! -f build/ik-cuda/build.ninja ]; then
    cmake -S "$src" -B build/ik-cuda -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
      -DGGML_IQK_FA_ALL_QUANTS=OFF -DCMAKE_BUILD_TYPE=Release \
      -DCUDA_cublas_LIBRARY="$CB/libcublas.so.13" -DCUDA_cublasLt_LIBRARY="$CB/libcublasLt.so.13" \
      -DCUDA_cuda_driver_LIBRARY=/usr/local/nvidia/lib64/libcuda.so.1 \
      "-DCMAKE_CUDA_FLAGS=-I$CB/../include" "-DCMAKE_CXX_FLAGS=-I$CB/../include" > "$out/configure.log" 2>&1 \
      || { tail -40 "$out/configure.log"; exit 1; }
  fi
  left=$((limit - ($(date +%s) - t0)))
  timeout "$left" cmake --build build/ik-cuda -j 16 --target llama-server > "$out/build.log" 2>&1
  rc=$?
  tail -30 "$out/build.log" > "$out/build-tail.log"; rm -f "$out/build.log"
  grep -c "Building\|Linking" "$out/build-tail.log" >/dev/null
  echo "build rc=$rc after $(( $(date +%s) - t0 )) s; $(ls build/ik-cuda/ggml/src/CMakeFiles/ggml.dir/ggml-cuda 2>/dev/null | wc -l) cuda objects"
  [ -x "$bin" ] || { echo "not built yet"; exit 0; }
fi
echo "built at $(( $(date +%s) - t0 )) s"
mkdir -p .gpu/pylib
python3 -m pip install -q --no-index --no-deps --target .gpu/pylib .gpu/wheels/gguf-*.whl .gpu/wheels/tqdm-*.whl \
  $(ls .gpu/wheels/pyyaml-*cp$(python3 -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')-*.whl) > "$out/pip.log" 2>&1
export LD_LIBRARY_PATH="$CB:/usr/local/nvidia/lib64:$root/build/ik-cuda/bin:$root/build/ik-cuda/ggml/src:$root/build/ik-cuda/src:${LD_LIBRARY_PATH:-}"
PYTHONPATH="$root/.gpu/pylib:$root" python3 scripts/gpu/measure_server.py "$bin" "$out" "$deadline" "$@"
echo "done at $(( $(date +%s) - t0 )) s"
