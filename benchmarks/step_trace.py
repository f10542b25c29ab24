"""A profiler trace of the default sweep step of one trial on a GPU, and the kernels it
launched per step as CUDA counts them (what ``step_ops.py`` predicts on a CPU).

    python benchmarks/step_trace.py --model gpt2 --task bit-xor --out trace.json.gz

Warm-up steps first (compilation, CUDA-graph recording), then ``--steps`` profiled steps:
prints one JSON line (kernels per step, CUDA-graph launches per step, the step's mode) and
writes the Chrome trace.
"""

from __future__ import annotations

import argparse
import json
import sys

import _harness as h

h.quiet()

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from scale_fpt.steps.cohort import CohortStep  # noqa: E402
from scale_fpt.tasks import build_task  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--task", default="bit-xor")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default="trace.json.gz")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, "step_trace.py: needs a CUDA GPU (it traces CUDA kernels)\n")
    config = h.trial_config(args.model, args.task, "fpt", args.batch, precision="bf16")
    step = CohortStep([config], build_task(config.task, config.train.seed))
    try:
        for position in range(args.warmup):
            step.train_step(position)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for position in range(args.warmup, args.warmup + args.steps):
                step.train_step(position)
            torch.cuda.synchronize()
        events = prof.events()
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        graphs = sum(1 for e in events if e.name == "cudaGraphLaunch")
        launches = sum(1 for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel"))
        prof.export_chrome_trace(args.out)
        print(
            json.dumps(
                {
                    "model": args.model,
                    "task": args.task,
                    "batch": args.batch,
                    "step_mode": step.compilation.mode,
                    "step_compiled": step.compilation.compiled,
                    "gpu_kernels_per_step": kernels / args.steps,
                    "cuda_graph_launches_per_step": graphs / args.steps,
                    "host_kernel_launches_per_step": launches / args.steps,
                    "trace": args.out,
                }
            )
        )
    finally:
        step.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
