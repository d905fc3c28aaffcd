#!/usr/bin/env bash
# Build the real engines for the engine test suite (tests/engine/): llama.cpp and ik_llama.cpp,
# CPU + RPC backends, from the pinned PyPI source packages that vendor them.
#
#   scripts/build-engines.sh            # both engines
#   scripts/build-engines.sh llama      # one
#
# Builds go to $MOECONF_ENGINE_CACHE (default ~/.cache/moeconf/engines), one folder per package
# version; a folder with a finished build is reused, so only the first run pays the build time
# (about 6 minutes for llama.cpp and 25 for ik_llama.cpp on 2 cores).
set -euo pipefail

LLAMA_PKG="llama-cpp-python==0.3.36"
IK_PKG="ik-llama-cpp-python==0.1.5"
CACHE="${MOECONF_ENGINE_CACHE:-$HOME/.cache/moeconf/engines}"
JOBS="${MOECONF_BUILD_JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE"

fetch() {  # fetch PKG NAME-VERSION: unpack the source package into $CACHE/NAME-VERSION/src
  local pkg="$1" dir="$CACHE/$2"
  if [ ! -d "$dir/src" ]; then
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    "$PY" -m pip download -q --no-deps --no-binary :all: "$pkg" -d "$dir.tmp"
    tar -xzf "$dir.tmp"/*.tar.gz -C "$dir.tmp"
    mkdir -p "$dir"
    mv "$dir.tmp"/*/ "$dir/src"
    rm -rf "$dir.tmp"
  fi
}

LLAMA_TARGETS="llama-completion ggml-rpc-server llama-fit-params"

build_llama() {
  local dir="$CACHE/llama-cpp-python-0.3.36"
  if [ -f "$dir/DONE" ]; then
    # a cached build gains the targets added since it was made (llama-fit-params: the memory oracle)
    local t missing=""
    for t in $LLAMA_TARGETS; do [ -x "$dir/build/bin/$t" ] || missing="$missing $t"; done
    if [ -n "$missing" ]; then
      echo "llama.cpp: adding$missing to the cached build in $dir"
      # shellcheck disable=SC2086
      cmake --build "$dir/build" -j "$JOBS" --target $missing >> "$dir/build.log"
    fi
    echo "llama.cpp: cached in $dir"; return
  fi
  fetch "$LLAMA_PKG" llama-cpp-python-0.3.36
  local src="$dir/src/vendor/llama.cpp"
  cmake -S "$src" -B "$dir/build" -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > "$dir/configure.log"
  # shellcheck disable=SC2086
  cmake --build "$dir/build" -j "$JOBS" --target $LLAMA_TARGETS > "$dir/build.log"
  touch "$dir/DONE"
  echo "llama.cpp: built in $dir"
}

build_ik() {
  local dir="$CACHE/ik-llama-cpp-python-0.1.5"
  if [ -f "$dir/DONE" ]; then echo "ik_llama.cpp: cached in $dir"; return; fi
  fetch "$IK_PKG" ik-llama-cpp-python-0.1.5
  local src="$dir/src/vendor/ik_llama.cpp"
  # the package lacks the build-info generator: provide the four definitions it would write
  if [ ! -f "$src/common/build-info.cpp" ]; then
    cat > "$src/common/build-info.cpp" <<'CPP'
int LLAMA_BUILD_NUMBER = 0;
char const *LLAMA_COMMIT = "ik-llama-cpp-python-0.1.5";
char const *LLAMA_COMPILER = "cc";
char const *LLAMA_BUILD_TARGET = "x86_64";
CPP
    touch "$src/common/build-info.cpp"
  fi
  cmake -S "$src" -B "$dir/build" -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DGGML_NATIVE=OFF -DGGML_IQK_FA_ALL_QUANTS=OFF -DCMAKE_BUILD_TYPE=Release > "$dir/configure.log"
  cmake --build "$dir/build" -j "$JOBS" --target llama-cli rpc-server > "$dir/build.log"
  touch "$dir/DONE"
  echo "ik_llama.cpp: built in $dir"
}

case "${1:-all}" in
  llama) build_llama ;;
  ik) build_ik ;;
  all) build_llama; build_ik ;;
  *) echo "usage: $0 [llama|ik|all]" >&2; exit 2 ;;
esac
