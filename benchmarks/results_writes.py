"""The driver's own results work per trial, without Ray: does it grow with the sweep?

    python benchmarks/results_writes.py 100 1000

For each N: N trials of ``--evals`` evaluations written through ``results.ResultsWriter``
as the driver's results callback writes them (each evaluation: the curve so far, then the
trial row, each file replaced atomically with an fsync), each trial ended into the
driver's background compaction (``sweep.callbacks.Compactor``: every 256 ended trials),
then the final compaction. Prints wall and CPU milliseconds per trial, the files the trials
directory ends with and the process's peak memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from scale_fpt.config import TrialConfig
from scale_fpt.results import ResultsWriter
from scale_fpt.sweep.callbacks import Compactor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials", type=int, nargs="+")
    parser.add_argument("--evals", type=int, default=20)
    args = parser.parse_args()
    config = TrialConfig().to_flat()
    for n in args.trials:
        with tempfile.TemporaryDirectory() as tmp:
            writer = ResultsWriter(tmp, "s")
            compactor = Compactor(writer)
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(n):
                trial_id = f"{i:012x}"
                row = {**config, "trial_id": trial_id, "status": "running", "steps_done": 0}
                for k in range(1, args.evals + 1):
                    curve = {**config, "step": 10 * k, "test_accuracy": 0.5}
                    writer.write_curve(trial_id, [curve])
                    writer.write_trial({**row, "steps_done": 10 * k})
                writer.write_trial({**row, "status": "completed", "stop_reason": "budget"})
                compactor.ended([trial_id])
            compactor.finish()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            files = len(list((Path(tmp) / "s" / "trials").iterdir()))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{n} trials x {args.evals} evaluations: {wall / n * 1000:.1f} ms wall, "
            f"{cpu / n * 1000:.1f} ms CPU per trial; trials/ ends with {files} file(s); "
            f"peak memory {peak:.0f} MB",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
