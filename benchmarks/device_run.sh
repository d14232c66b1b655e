#!/usr/bin/env bash
# Test or benchmark a built hotloop wheel on this machine's GPU, installed the way a user
# installs it (into its own folder, no source tree on sys.path), with the torch already
# installed here:
#
#   bash benchmarks/device_run.sh tests WHEEL OUT_DIR   # python -m hotloop, tests/ops on CUDA,
#                                                      # compute-sanitizer memcheck
#   bash benchmarks/device_run.sh bench WHEEL OUT_DIR [benchmark options]
#
# tests/ops runs in HOTLOOP_TEST_SHARDS processes at once (default 4; tests/ops/sharding.py),
# beside memcheck, each logging to OUT_DIR/gpu-tests-I.log: on an H200 the suite's tests take
# about 17 minutes, longer than a lent machine's call, and four processes about 6 (run 131 in
# benchmarks/NOTES.md, split by hand).
#
# For a machine without network access: wheels the benchmark needs besides torch (e.g.
# Liger-Kernel) are taken from .whl/ when that folder exists. Run from the repository root.
set -uo pipefail
phase=${1:-} wheel=${2:-} out=${3:-}
if [ -z "$out" ] || [ ! -f "$wheel" ]; then
  echo "usage: $0 tests|bench WHEEL OUT_DIR [benchmark options] (WHEEL must exist)" >&2
  exit 2
fi
shift 3
shards=${HOTLOOP_TEST_SHARDS:-4}
if ! [[ $shards =~ ^[1-9][0-9]*$ ]]; then
  echo "HOTLOOP_TEST_SHARDS=$shards: expected a number of processes, 1 or more" >&2
  exit 2
fi
repo=$(pwd)
site=$(mktemp -d /tmp/hotloop-site.XXXXXX)
extra=()
[ -d .whl ] && extra=(.whl/*.whl)
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" "${extra[@]}" \
  || exit 1
export PYTHONPATH=$site PYTHONUNBUFFERED=1
status=0
case $phase in
  tests)
    { nvidia-smi; python3 -m hotloop; } 2>&1 | tee "$out/env.txt" || status=1
    pids=()
    for ((i = 0; i < shards; i++)); do
      (cd /tmp && HOTLOOP_TEST_SHARD="$i/$shards" HOTLOOP_TEST_INSTALLED=1 python3 -m pytest \
        "$repo/tests/ops" -c "$repo/pyproject.toml" --rootdir "$repo" -p no:cacheprovider -q -ra \
        --durations=15) > "$out/gpu-tests-$i.log" 2>&1 &
      pids+=($!)
    done
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/ops/memcheck_ops.py \
      > "$out/memcheck.log" 2>&1 || status=1
    for pid in "${pids[@]}"; do
      wait "$pid" || status=1
    done
    for ((i = 0; i < shards; i++)); do
      echo "tests/ops, shard $i of $shards: $(tail -n 1 "$out/gpu-tests-$i.log")"
    done
    tail -n 3 "$out/memcheck.log"
    ;;
  bench)
    python3 benchmarks/bench_rms_norm.py --out "$out" "$@" 2>&1 | tee "$out/bench.log" || status=1
    ;;
  *) echo "usage: $0 tests|bench WHEEL OUT_DIR [benchmark options]" >&2; exit 2 ;;
esac
exit $status
