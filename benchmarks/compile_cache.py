"""What a trial pays to compile its step, cold and from the node's compile cache.

Two trial processes run one after the other with one fresh ``TORCHINDUCTOR_CACHE_DIR``
(``steps.choice.compile_cache``): the first compiles every graph of its first training step
(cold), the second loads them from the cache (warm: dynamo still traces, inductor and
AOTAutograd load). Each process prints its build, first-step and second-step seconds.

    python benchmarks/compile_cache.py --model gpt2-tiny --compile default
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, time
from scale_fpt.config import TrialConfig
from scale_fpt.trial import TrialRun
config = TrialConfig.from_flat(json.loads(sys.argv[1]))
start = time.perf_counter()
run = TrialRun([config])
built = time.perf_counter()
run.step.train_step(0)
first = time.perf_counter()
run.step.train_step(1)
print(json.dumps({"build_s": round(built - start, 2), "first_step_s": round(first - built, 2),
                  "second_step_s": round(time.perf_counter() - first, 4)}))
run.close()
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--task", default="bit-xor")
    parser.add_argument("--compile", default="default", choices=("default", "reduce-overhead"))
    parser.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    flat = {
        "task": args.task,
        "model": args.model,
        "init": "random",
        "batch_size": 4,
        "compile": args.compile,
        "accelerator": args.accelerator,
    }
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for which in ("cold", "warm"):
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(flat)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["process_s"] = round(time.perf_counter() - start, 2)
            print(json.dumps({"cache": which, **flat, **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
