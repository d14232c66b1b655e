#!/usr/bin/env bash
# Test or benchmark a built hotloop wheel on this machine's GPU, installed the way a user
# installs it (into its own folder, no source tree on sys.path), with the torch already
# installed here, its outputs in OUT_DIR (new or empty: it writes fixed file names there):
#
#   bash benchmarks/device_run.sh tests WHEEL OUT_DIR   # python -m hotloop, tests/ops on CUDA,
#                                                      # compute-sanitizer memcheck
#   bash benchmarks/device_run.sh bench WHEEL OUT_DIR [benchmark options]
#   bash benchmarks/device_run.sh compare WHEEL[,WHEEL...] OUT_DIR BASE_WHEEL [benchmark options]
#   bash benchmarks/device_run.sh same WHEEL OUT_DIR BASE_WHEEL
#   bash benchmarks/device_run.sh ncu WHEEL OUT_DIR H[,H...] [profile_rows.py options]
#
# compare: a change's before (BASE_WHEEL) and after (WHEEL) on this GPU, the benchmark run
# for each wheel in turn, each in its own process, HOTLOOP_COMPARE_ROUNDS rounds (default 2),
# then compare_runs.py over them (OUT_DIR/compare/compare_runs.md). Options such as --hidden
# 32768,65536 --rms-norm-only --no-small-batch keep a round short. Several candidates
# (WHEEL,WHEEL2,...; labels new, new2, ...) take their turns after the base in every round: the
# base's runs serve them all, and they compare with each other within one stretch of time.
#
# same: whether WHEEL's outputs are BASE_WHEEL's to the bit (output_digests.py): each wheel
# dumps the digests of its outputs over a grid of seeded inputs in its own process
# (OUT_DIR/digests-base.json, digests-new.json), then OUT_DIR/same.md names each case that
# differs; the phase fails if any does.
#
# ncu: Nsight Compute's full set of sections (--set full, --clock-control none) on one call of
# rms_norm at each width H (profile_rows.py: the benchmark's sweep shape, the warm-up outside
# the profiled range), one process a width; options such as --mode fwd+bwd --casting llama go to
# profile_rows.py. For each width, in OUT_DIR: ncu-H.ncu-rep (the report, for Nsight Compute's
# window), ncu-H.txt (its sections), ncu-H-sass.csv (the source page: each SASS instruction's
# executions and stall samples), ncu-H-sass.md (ncu_sass_summary.py over it) and ncu-H.log.
#
# tests/ops runs in HOTLOOP_TEST_SHARDS processes at once (default 4; tests/ops/sharding.py),
# beside memcheck, each logging to OUT_DIR/gpu-tests-I.log: on an H200 the suite's tests take
# about 17 minutes, longer than a lent machine's call, and four processes about 6 (run 131 in
# benchmarks/NOTES.md, split by hand).
#
# For a machine without network access: wheels the benchmark needs besides torch (e.g.
# Liger-Kernel) are taken from .whl/ when that folder exists. Run from the repository root.
set -uo pipefail
usage="usage: $0 tests|bench WHEEL OUT_DIR [benchmark options], or
       $0 compare WHEEL[,WHEEL...] OUT_DIR BASE_WHEEL [benchmark options], or
       $0 same WHEEL OUT_DIR BASE_WHEEL, or
       $0 ncu WHEEL OUT_DIR H[,H...] [profile_rows.py options]
       (the wheels must exist, OUT_DIR new or empty)"
phase=${1:-} wheel=${2:-} out=${3:-}
# compare's candidates: WHEEL, or WHEEL,WHEEL2,... (labels new, new2, ...)
candidates=("$wheel")
if [ "$phase" = compare ]; then
  IFS=, read -ra candidates <<< "$wheel"
  wheel=${candidates[0]:-}
  for candidate in "${candidates[@]:1}"; do
    if [ ! -f "$candidate" ]; then
      echo "$candidate: no such wheel (a candidate of compare's WHEEL,WHEEL2,...)" >&2
      exit 2
    fi
  done
fi
if [ -z "$out" ] || [ ! -f "$wheel" ]; then
  echo "$usage" >&2
  exit 2
fi
shift 3
# A count from the environment, checked before anything is installed: count NAME VALUE WHAT.
count() {
  if ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
    echo "$1=$2: expected a number of $3, 1 or more" >&2
    exit 2
  fi
}
case $phase in
  tests)
    shards=${HOTLOOP_TEST_SHARDS:-4}
    count HOTLOOP_TEST_SHARDS "$shards" processes
    ;;
  compare | same)
    base_wheel=${1:-}
    if [ ! -f "$base_wheel" ]; then
      echo "$usage" >&2
      exit 2
    fi
    shift
    if [ "$phase" = same ] && [ $# -gt 0 ]; then
      echo "same: takes no options after BASE_WHEEL, got '$*'" >&2
      echo "$usage" >&2
      exit 2
    fi
    if [ "$phase" = compare ]; then
      rounds=${HOTLOOP_COMPARE_ROUNDS:-2}
      count HOTLOOP_COMPARE_ROUNDS "$rounds" rounds
    fi
    ;;
  ncu)
    widths=${1:-}
    if ! [[ $widths =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; then
      echo "ncu: expected the widths to profile, such as 2047,2048, got '$widths'" >&2
      echo "$usage" >&2
      exit 2
    fi
    shift
    ;;
esac
# Every phase writes fixed names (env.txt, memcheck.log, bench.log, base-1.log, ncu-H.txt, ...)
# into OUT_DIR: it must be new or empty, so that no file of the user's is overwritten.
if [ -e "$out" ] && { [ ! -d "$out" ] || [ -n "$(ls -A "$out")" ]; }; then
  echo "$out is not empty (or not a folder): pass a new OUT_DIR; this script writes fixed" \
    "file names there and would overwrite what is in it" >&2
  exit 2
fi
repo=$(pwd)
extra=()
[ -d .whl ] && extra=(.whl/*.whl)
# A new folder holding WHEEL and the benchmark's extra wheels; prints its path.
install_site() {
  local site
  site=$(mktemp -d "${TMPDIR:-/tmp}/hotloop-site.XXXXXX")
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$1" "${extra[@]}" \
    >&2 || exit 1
  echo "$site"
}
# The GPU, its driver and the installed hotloop, to stdout and OUT_DIR/env.txt. The query names
# the GPU by UUID, which nvidia-smi's table leaves out and benchmarks/NOTES.md records a run by.
record_env() {
  {
    nvidia-smi --query-gpu=name,uuid,driver_version --format=csv
    nvidia-smi
    python3 -m hotloop
  } 2>&1 | tee "$out/env.txt"
}
mkdir -p "$out"
site=$(install_site "$wheel") || exit 1
# compare and same: each label's folder (base: BASE_WHEEL's; new, new2, ...: the candidates').
declare -A site_of_label=([new]=$site)
labels=(base new)
for ((i = 1; i < ${#candidates[@]}; i++)); do
  labels+=("new$((i + 1))")
  site_of_label[new$((i + 1))]=$(install_site "${candidates[i]}") || exit 1
done
if [ "$phase" = compare ] || [ "$phase" = same ]; then
  site_of_label[base]=$(install_site "$base_wheel") || exit 1
fi
site_of() {
  echo "${site_of_label[$1]}"
}
export PYTHONPATH=$site PYTHONUNBUFFERED=1
status=0
case $phase in
  tests)
    record_env || status=1
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
  compare)
    for ((round = 1; round <= rounds; round++)); do
      for label in "${labels[@]}"; do
        PYTHONPATH=$(site_of "$label") python3 benchmarks/bench_rms_norm.py --no-plot \
          --out "$out/$label-$round" "$@" > "$out/$label-$round.log" 2>&1 || status=1
      done
    done
    compared=()
    for label in "${labels[@]}"; do
      compared+=(--label "$label")
      for ((round = 1; round <= rounds; round++)); do
        compared+=("$out/$label-$round/rms_norm.json")
      done
    done
    python3 benchmarks/compare_runs.py "${compared[@]}" --out "$out/compare" || status=1
    ;;
  same)
    record_env || status=1
    for label in base new; do
      PYTHONPATH=$(site_of $label) python3 benchmarks/output_digests.py dump \
        "$out/digests-$label.json" > "$out/digests-$label.log" 2>&1 || status=1
    done
    python3 benchmarks/output_digests.py compare "$out/digests-base.json" \
      "$out/digests-new.json" --out "$out/same.md" || status=1
    ;;
  ncu)
    record_env || status=1
    IFS=, read -ra hidden_list <<< "$widths"
    for hidden in "${hidden_list[@]}"; do
      report=$out/ncu-$hidden
      # Each step's output goes to the width's log, whose end a failure shows.
      if ncu --profile-from-start off --clock-control none --set full -o "$report" \
        python3 benchmarks/profile_rows.py --hidden "$hidden" "$@" > "$report.log" 2>&1 &&
        ncu --import "$report.ncu-rep" > "$report.txt" 2>> "$report.log" &&
        ncu --import "$report.ncu-rep" --page source --print-source sass --csv \
          > "$report-sass.csv" 2>> "$report.log" &&
        python3 benchmarks/ncu_sass_summary.py "$report-sass.csv" > "$report-sass.md" \
          2>> "$report.log"; then
        echo "ncu, H = $hidden: $report.txt, $report-sass.md"
      else
        status=1
        echo "ncu, H = $hidden failed; the end of $report.log:" >&2
        tail -n 5 "$report.log" >&2
      fi
    done
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
exit $status
