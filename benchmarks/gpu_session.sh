#!/usr/bin/env bash
# Issue 20 on a lent GPU: the GPU tests, the speed targets' benchmarks and the whole suite,
# each a stage under its own time limit, logs written under $OUT (at most 7 files: the
# device tool returns 8). Run from the repository root, in one device call per line of
# docs/gpu.md's plan (a call may run 10 minutes), e.g. with carry [".whl"]:
#
#   bash benchmarks/gpu_session.sh gpu steps      # call 1: pytest -m gpu, step targets
#   bash benchmarks/gpu_session.sh packing e2e    # call 2: packed K from the plan, 64-trial grid
#   bash benchmarks/gpu_session.sh suite          # call 3: the whole suite
#
# Stages (seconds are each stage's limit, chosen so that each call above ends within ~9.5
# minutes with the ~30 s install):
#   gpu      pytest -m gpu                                              (270 s)
#   steps    step_throughput.py: one unpacked gpt2 bit-xor trial (batch 4), frozen and full
#            gpt2-medium cifar10-lra (batch 16), data share of each step; step_ops.py: the
#            kernel ops and syncs per step of each path, for the record   (270 s)
#   packing  packing.py: gpt2 bit-xor and bit-memory at K = 1 and the memory plan's K (240 s)
#   e2e      end_to_end.py: 64 gpt2 bit-xor trials x 5,000 steps, command to last row (300 s)
#   suite    pytest (everything, the GPU tests included)                (560 s)
#   plumbing every benchmark in its smallest form (for a CPU check of this script)
# A stage killed at its limit keeps what it wrote; summary.txt lists every stage's exit
# code, duration and target lines.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-session-out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
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
for what in "${@:-gpu steps}"; do
  for name in $what; do
    case "$name" in
      gpu)
        stage gpu-tests 270 python -m pytest -q -m gpu -p no:cacheprovider --durations=20 ;;
      steps)
        # one unpacked trial: the packed path with K = 1 (what a packable trial alone runs)
        stage steps 270 bash -c '
          python benchmarks/step_throughput.py --models gpt2 --tasks bit-xor --finetune fpt \
            --batch-size 4 --steps 100 --warmup 20 --peak-seconds 2 &&
          python benchmarks/step_throughput.py --models gpt2-medium --tasks cifar10-lra \
            --finetune fpt,full --batch-size 16 --lra-batch-size 16 --steps 10 --warmup 3 \
            --images 2000 --peak-seconds 2 &&
          python benchmarks/step_ops.py --path all --model gpt2 --task bit-xor --batch 4 \
            --precision bf16 --no-bytes' ;;
      packing)
        stage packing 240 python benchmarks/packing.py --models gpt2 \
          --tasks bit-xor,bit-memory --k 1,plan --batch-size 4 --steps 10 --big-steps 10 \
          --warmup 3 --peak-seconds 2 ;;
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
        echo "unknown stage $name (gpu steps packing e2e suite plumbing)" >&2
        exit 2 ;;
    esac
  done
done
cat "$SUMMARY"
