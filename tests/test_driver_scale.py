"""What keeps a sweep's driver linear in its trials (benchmarks/driver_scale.py measures it):
Ray Tune saves its experiment state (every trial's last result) on a clock, not once per
trial, and the progress output is one line per interval whatever the sweep's size."""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from scale_fpt.cluster import GPUOffer
from scale_fpt.sweep.config import SweepConfig
from scale_fpt.sweep.driver import SharedGrid, trial_resources
from scale_fpt.sweep.plan import plan_sweep, sweep_placement
from scale_fpt.sweep.progress import MAX_ARM_LINES, SweepProgress, progress_callback_class


def member_row(k: int, arm: int, accuracy: float, status: str = "completed") -> dict:
    return {
        "trial_id": f"t{k}", "task": "bit-xor", "model": f"m{arm}", "init": "random",
        "finetune": "fpt", "seed": k, "lr": 1e-3, "steps_done": 2, "status": status,
        "best_val_accuracy": accuracy, "val_accuracy": accuracy, "test_accuracy": accuracy,
        "selected_step": 2,
    }  # fmt: skip


def test_a_plain_status_line_names_the_best_arms_only_whatever_the_sweep_size():
    stream = io.StringIO()
    progress = SweepProgress("big", planned_steps=0, stream=stream, every_s=3600.0)
    arms = 200
    progress.add_rows([member_row(k, k % arms, (k % arms) / arms, "running") for k in range(2_000)])
    progress.tick()  # within the interval: nothing
    assert stream.getvalue() == ""
    progress.tick(force=True)
    (line,) = stream.getvalue().splitlines()
    best = line.split("; best val acc: ", 1)[1].split("; ")
    assert len(best) == MAX_ARM_LINES + 1
    assert best[0] == f"bit-xor/m{arms - 1}/random/fpt {(arms - 1) / arms:.3f}"
    assert best[-1] == f"... and {arms - MAX_ARM_LINES} more arms"


def test_a_grid_of_cohorts_gives_each_trial_its_cohort_without_copying_the_grid():
    # Tune's variant generator deep-copies the search space for every trial it makes: the
    # grid's values are shared, so a trial costs the same at 10 or 10,000 cohorts.
    # (Tune first swaps the values for its placeholders' copy, as Tuner.fit does.)
    from ray.tune.impl.placeholder import create_resolvers_map, inject_placeholders
    from ray.tune.search.variant_generator import generate_variants

    groups = [[{"seed": i, "lr": 1e-3}, {"seed": i, "lr": 3e-3}] for i in range(500)]
    space = {"sweep": "s", "members": SharedGrid(grid_search=groups)}
    space = inject_placeholders(copy.deepcopy(space), create_resolvers_map())
    axis = space["members"]
    assert copy.deepcopy(space)["members"] is axis
    configs = [config for _, config in generate_variants(space)]
    assert [c["members"] for c in configs] == groups
    assert all(c["sweep"] == "s" for c in configs)


def test_the_resources_callback_pickles_as_a_token_whatever_the_plans_size():
    # Tune unpickles the registered trainable, this callback with it, for every trial it
    # makes: the plan of 200 cohorts (341 kB pickled) must not travel with it.
    def plan_of(seeds: int):
        sweep = SweepConfig(
            name="s", base={"task": "bit-xor", "model": "gpt2-tiny", "init": "random"},
            grid={"lr": [1e-3, 3e-3]}, seeds=tuple(range(seeds)), pack="auto", gpus_per_trial="0",
        )  # fmt: skip
        cpus = GPUOffer(None, 0, "--gpus-per-trial 0")
        return plan_sweep(sweep, sweep_placement(sweep, cpus, {"CPU": 2.0}))  # two CPU slots

    small, large = trial_resources(plan_of(2)), trial_resources(plan_of(200))
    assert len(pickle.dumps(large)) == len(pickle.dumps(small)) < 200
    again = pickle.loads(pickle.dumps(large))
    assert again is large  # in the driver: the live callback, its plan and lookup table
    cohort = large.plan.cohorts[-1]
    asked = again({"sweep": "s", "members": list(cohort.members)})
    assert asked.bundles == cohort.resources().bundles == [{"CPU": 1}]


def test_the_status_line_counts_ray_tunes_saves_of_the_experiment_state():
    callback = progress_callback_class()("s", 0)
    stream = io.StringIO()
    callback.progress = SweepProgress("s", 0, stream=stream, every_s=0.0)
    assert "experiment state" not in callback.progress.status_line()
    # Tune asks each callback for its state at every save; ours adds nothing to the file.
    assert [callback.get_state() for _ in range(3)] == [None, None, None]
    assert callback.progress.status_line().endswith("; experiment state saved 3 times")


@pytest.mark.slow
def test_a_sweep_of_one_evaluation_trials_saves_its_state_on_a_clock_not_per_trial(
    tmp_path, monkeypatch, capsys
):
    """With the driver's run configuration, 40 trials that each checkpoint once save Tune's
    experiment state about every 10 s (``TUNE_GLOBAL_CHECKPOINT_S=auto``) and once at the
    end; keeping one checkpoint per trial saved it after every trial (O(trials^2) bytes).
    The plain progress line comes once per ``SCALE_FPT_PROGRESS_EVERY`` seconds."""
    from ray import tune

    from scale_fpt.sweep.callbacks import driver_callbacks_class
    from scale_fpt.sweep.driver import run_config
    from tests.helpers import own_ray

    def one_evaluation(config: dict) -> None:
        # Reports once with a checkpoint, as a one-evaluation trial does. Defined here: Ray
        # pickles it by value (its workers cannot import a test module).
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "weights").write_text(str(config["members"]))
            checkpoint = tune.Checkpoint.from_directory(directory)
            tune.report({"val_accuracy": 0.5}, checkpoint=checkpoint)

    monkeypatch.setenv("SCALE_FPT_PROGRESS_EVERY", "5")
    trials = 40
    start = time.monotonic()
    progress = progress_callback_class()("drive", 0)
    callbacks = driver_callbacks_class()(str(tmp_path / "results"), [progress])
    with own_ray(num_cpus=2):
        tuner = tune.Tuner(
            tune.with_resources(one_evaluation, {"cpu": 1}),
            param_space={"sweep": "drive", "members": tune.grid_search([[{"seed": i}] for i in range(trials)])},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=run_config("drive", str(tmp_path / "ray"), callbacks, 0),
        )  # fmt: skip
        grid = tuner.fit()
        elapsed = time.monotonic() - start
    assert len(grid) == trials and not grid.errors
    saves = progress.progress.state_saves
    assert 1 <= saves <= 2 + elapsed / 10, (saves, elapsed)
    assert tune.Tuner.can_restore(str(tmp_path / "ray" / "drive"))  # the last save: complete
    status = [
        line
        for line in capsys.readouterr().err.splitlines()
        if re.match(r"\[scale-fpt\] drive: trials \d+ done", line)
    ]
    # One line per 5 s while it runs (Tune's on_step_end), and the last word at its end.
    assert elapsed < 10 or len(status) >= 2, (status, elapsed)
    assert 1 <= len(status) <= 2 + elapsed / 5, (len(status), elapsed)
    assert status[-1].startswith(f"[scale-fpt] drive: trials {trials} done, 0 running")
    assert status[-1].endswith(f"experiment state saved {saves} times")


@pytest.mark.slow
def test_driver_scale_benchmark_measures_each_size_through_the_command():
    """``benchmarks/driver_scale.py --quick``: two sweeps (4 and 8 trials) through `scale-fpt
    sweep`, each size's figures read off the command's rows, log and processes."""
    repo = Path(__file__).resolve().parent.parent
    command = [sys.executable, "benchmarks/driver_scale.py", "--quick", "--json"]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    sizes = json.loads(done.stdout.splitlines()[-1])
    assert [s["trials"] for s in sizes] == [4, 8] and [s["tune_trials"] for s in sizes] == [4, 8]
    for size in sizes:
        assert 0 < size["training_summed_s"] < size["wall_to_last_row_s"] <= size["exit_s"]
        assert size["driver_cpu_s"] > 0 and size["driver_peak_rss_mb"] > 50
        assert size["ray_cpu_s"] > 0 and size["ray_peak_rss_mb"] > 50
        # A line per trial and the last status line, which counts Tune's state saves.
        assert size["progress_lines"] >= size["trials"] + 1 and size["status_lines"] >= 1
        assert size["experiment_state_saves"] >= 1 and size["experiment_state_mb"] > 0
    assert "target: overhead per trial grows at most 10% per size" in done.stdout
