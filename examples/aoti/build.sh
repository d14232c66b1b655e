#!/usr/bin/env bash
# Builds hotloop_aoti_run with the machine's g++ against the libtorch inside an installed torch
# wheel, or an unpacked libtorch archive (the same include/ and lib/ layout).
#
#   examples/aoti/build.sh [OUT_DIR]        (default: build/aoti; prints the program's path)
#
# TORCH_DIR  torch's folder; by default ${PYTHON:-python3} is asked where torch is installed.
# CXX        the compiler (default g++); torch >= 2.10's headers need C++20 (gcc >= 11).
#
# One compiler line rather than CMake: torch's TorchConfig.cmake, in a CUDA wheel, refuses to
# configure without a full CUDA toolkit, although this program compiles no CUDA code and only
# needs torch's headers and libraries.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-build/aoti}
torch_dir=${TORCH_DIR:-$("${PYTHON:-python3}" -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
if [[ ! -f "$torch_dir/include/torch/csrc/inductor/aoti_package/model_package_loader.h" ]]; then
  echo "build.sh: $torch_dir has no torch/csrc/inductor/aoti_package headers;" \
    "set TORCH_DIR to an installed torch package (>= 2.6) or an unpacked libtorch" >&2
  exit 1
fi

mkdir -p "$out"
# -ltorch without --as-needed: in a CUDA build, libtorch.so pulls in libtorch_cuda.so, which
# registers AOTInductor's CUDA runner and the CUDA device, though the program names neither.
# The rpath lets the program find torch's libraries where they are installed.
"${CXX:-g++}" -std=c++20 -O2 \
  "$here/hotloop_aoti_run.cpp" -o "$out/hotloop_aoti_run" \
  -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include" \
  -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" \
  -Wl,--no-as-needed -ltorch -Wl,--as-needed -ltorch_cpu -lc10 -ldl
echo "$out/hotloop_aoti_run"
