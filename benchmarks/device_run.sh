#!/usr/bin/env bash
# A GPU session on the lent device machine, from the repository root:
#   bash benchmarks/device_run.sh tests|bench WHEEL_DIR OUT_DIR
# It installs the carried wheel the way a user would (no source tree on sys.path), then
#   tests: python -m hotloop, the whole op suite on CUDA, compute-sanitizer memcheck;
#   bench: benchmarks/bench_rms_norm.py.
# Extra wheels (Liger-Kernel for the benchmark) are taken from .whl/ when present.
set -uo pipefail
phase=$1 wheels=$2 out=$3
repo=$(pwd)
site=/tmp/hotloop-site
extra=()
[ -d .whl ] && extra=(.whl/*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
  "$wheels"/hotloop-*+pt211cu130-*.whl "${extra[@]}" || exit 1
export PYTHONPATH=$site PYTHONUNBUFFERED=1
status=0
case $phase in
  tests)
    { nvidia-smi; python3 -m hotloop; } 2>&1 | tee "$out/env.txt" || status=1
    (cd /tmp && HOTLOOP_TEST_INSTALLED=1 python3 -m pytest "$repo/tests/ops" -c "$repo/pyproject.toml" \
      --rootdir "$repo" -p no:cacheprovider -q -ra --durations=15) 2>&1 | tee "$out/gpu-tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/ops/memcheck_ops.py 2>&1 \
      | tee "$out/memcheck.log" | tail -n 15
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ;;
  bench)
    python3 benchmarks/bench_rms_norm.py --out "$out" 2>&1 | tee "$out/bench.log" || status=1
    ;;
  *) echo "usage: $0 tests|bench WHEEL_DIR OUT_DIR" >&2; exit 2 ;;
esac
exit $status
