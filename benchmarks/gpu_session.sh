#!/usr/bin/env bash
# The GPU check in one device call (issues 31 item 6 and 35): with carry [".whl"], from the
# repository root,
#
#   bash benchmarks/gpu_session.sh          # the default: every stage of "session" below
#
# installs the wheels (.whl/setup.sh, ~30 s) and runs, most valuable first, each stage under
# its own `timeout` (their limits add up to 510 s: the call ends within 9 minutes), writing
# its log under $OUT as it goes, so what a stage reached survives any limit:
#   gpu      pytest -m gpu tests/test_gpu_steps.py tests/test_dropout_kernels.py and the
#            attention and cohort tests of tests/test_gpu.py: several steps of the engine,
#            compiled engine, eager and compiled cohort under sync-debug "error"; no
#            recompiles after warm-up; cudagraph_skips == 0; compiled = eager; the row's
#            step; the Triton dropout and attention kernels compiled (keyed masks and
#            gradients against the CPU's, stacked inputs, token-major layouts)     (230 s)
#   steps    step_throughput.py: steps/s of the default sweep path of one gpt2 bit-xor trial
#            (batch 4, --compile auto: the K = 1 cohort with CUDA graphs; target >= 300) and
#            of the engine path; MFU of gpt2-medium cifar10-lra fpt batch 16; step_trace.py:
#            a profiler trace of the default step and its CUDA kernels per step    (130 s)
#   packing  packing.py: gpt2 bit-xor at the memory plan's K                  (50 s)
#   grid     end_to_end.py: a reduced 64-trial grid (8 lrs x 8 seeds x 300 steps of gpt2
#            bit-xor), command to last Parquet row                            (100 s)
# Other stages, one call each where time allows: gpu-all (every gpu test, 560 s), suite (the
# whole suite, 560 s), plumbing (every benchmark above in its smallest form, for a CPU check
# of this script). summary.txt lists every stage's exit code, duration and target lines.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-session-out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
export OUT
if [ -f .whl/setup.sh ]; then
  # shellcheck disable=SC1091
  . .whl/setup.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

stage() {  # stage NAME LIMIT_S COMMAND...: the command's output goes to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  local log="$OUT/$name.log" start
  start=$(date +%s)
  echo "== $name (limit ${limit} s): $*" >>"$SUMMARY"
  echo "== $(date -u +%FT%TZ) $*" >>"$log"
  timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "   exit $rc after $(($(date +%s) - start)) s" >>"$SUMMARY"
  grep -E '^target:|^(FAILED|ERROR) |[0-9]+ (passed|failed)|command -> last' "$log" \
    | tail -40 | sed 's/^/   /' >>"$SUMMARY"
  return 0
}

machine() {
  {
    echo "== $(date -u +%FT%TZ) on $(hostname)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
    python - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory)
for name in ("ray", "deepspeed", "optuna", "transformers", "triton"):
    try:
        print(name, __import__(name).__version__)
    except Exception as e:  # a missing package is what this line is for
        print(name, "MISSING", type(e).__name__)
PY
  } >>"$OUT/machine.txt" 2>&1
}

machine
for what in "${@:-session}"; do
  [ "$what" = session ] && what="gpu steps packing grid"
  for name in $what; do
    case "$name" in
      gpu)
        stage gpu-tests 230 python -m pytest -q -m gpu -p no:cacheprovider --durations=10 \
          tests/test_gpu_steps.py tests/test_dropout_kernels.py tests/test_gpu.py \
          -k "not test_gpu.py or attention or cohort" ;;
      steps)
        # one unpacked trial: the packed path with K = 1 (what a packable trial alone runs)
        # each command on its own (;): one that fails leaves the others their measurement
        stage steps 130 bash -c '
          python benchmarks/step_throughput.py --models gpt2 --tasks bit-xor --finetune fpt \
            --paths packed,trial --batch-size 4 --steps 100 --warmup 20 --peak-seconds 1;
          python benchmarks/step_trace.py --model gpt2 --task bit-xor --batch 4 \
            --out "$OUT/trace-gpt2-bit-xor.json.gz";
          python benchmarks/step_throughput.py --models gpt2-medium --tasks cifar10-lra \
            --finetune fpt --paths packed --batch-size 16 --lra-batch-size 16 --steps 10 \
            --warmup 3 --images 500 --peak-seconds 1' ;;
      packing)
        stage packing 50 python benchmarks/packing.py --models gpt2 --tasks bit-xor \
          --k plan --batch-size 4 --steps 10 --big-steps 10 --warmup 3 --peak-seconds 1 ;;
      grid)
        stage grid 100 python benchmarks/end_to_end.py --lrs 8 --seeds 8 --steps 300 \
          --repeats 1 ;;
      gpu-all)
        stage gpu-all 560 python -m pytest -q -m gpu -p no:cacheprovider --durations=20 ;;
      e2e)
        stage e2e 300 python benchmarks/end_to_end.py --repeats 1 ;;
      suite)
        stage suite 560 python -m pytest -q -p no:cacheprovider --durations=30 ;;
      plumbing)
        stage plumbing 900 bash -c '
          python benchmarks/step_throughput.py --models gpt2-tiny --tasks bit-xor \
            --finetune fpt --batch-size 4 --steps 2 --warmup 1 --peak-seconds 0.3 &&
          python benchmarks/step_throughput.py --models gpt2-tiny --tasks cifar10-lra \
            --finetune fpt,full --batch-size 2 --lra-batch-size 2 --steps 1 --warmup 1 \
            --images 20 --peak-seconds 0.3 &&
          python benchmarks/packing.py --models gpt2-tiny --tasks bit-xor,bit-memory \
            --k 1,plan --max-k 4 --batch-size 4 --steps 2 --big-steps 1 --warmup 1 \
            --procs 1 --peak-seconds 0.3 &&
          python benchmarks/end_to_end.py --model gpt2-tiny --lrs 2 --seeds 1 --steps 20 \
            --batch-size 4 --base dropout=0 --repeats 1' ;;
      *)
        echo "unknown stage $name (session gpu steps packing grid gpu-all e2e suite plumbing)" >&2
        exit 2 ;;
    esac
  done
done
cat "$SUMMARY"
