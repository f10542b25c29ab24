"""Learning-rate-fair searches (scale_fpt.search): every configuration trained for every seed,
scored on the seed mean, the paper's lr first, packed where the arm packs, resumable.

The searcher tests drive the real ``SeedMeanSearcher`` over a real SQLite Optuna study the
way Tune does (suggest, then the final report of each Tune trial); the sweep test runs a
real search end to end through a local Ray."""

from __future__ import annotations

import math

import optuna
import pytest

from scale_fpt.packing import seed_groups
from scale_fpt.search import (
    SeedMeanSearcher,
    configs_per_ask,
    seed_mean,
)
from scale_fpt.sweep import SweepConfig
from scale_fpt.trial import SEARCH_CONFIG, config_trial_id, split_search_config

BASE = {
    "task": "bit-xor",
    "model": "gpt2-tiny",
    "max_steps": 20,
    "eval_every": 10,
    "val_batches": 2,
}
METRIC = "best_val_accuracy"


def searcher(tmp_path, seeds=(0, 1, 2), init="pretrained", pack=1, n_configs=4, **search):
    arms = [{**BASE, "init": init, "seed": s} for s in seeds]
    return SeedMeanSearcher(
        sweep="s",
        seed_arms=arms,
        search=search or {"lr": ("loguniform", 1e-5, 1e-2)},
        study_name="s-arm",
        storage_url=f"sqlite:///{tmp_path / 'optuna.db'}",
        n_configs=n_configs,
        pack=pack,
        parallel=8,
        metric=METRIC,
    )


def finish(
    s: SeedMeanSearcher, tune_id: str, config: dict, value=None, status="completed"
) -> dict[str, float]:
    """Complete a Tune trial as its final report would: one row per member, the metric a
    function of the member's lr and seed (or ``value``). Returns {trial_id: metric}."""
    rows = []
    for member in config["members"]:
        flat, _ = split_search_config(member)
        metric = value if value is not None else 0.5 + flat["lr"] * 10 + flat["seed"] / 100
        rows.append({"trial_id": config_trial_id("s", flat), METRIC: metric, "status": status})
    s.on_trial_complete(tune_id, result={"final": True, "trial_rows": rows})
    return {r["trial_id"]: r[METRIC] for r in rows}


def study(tmp_path) -> optuna.Study:
    return optuna.load_study(study_name="s-arm", storage=f"sqlite:///{tmp_path / 'optuna.db'}")


def test_each_configuration_trains_every_seed_and_is_told_the_seed_mean(tmp_path):
    s = searcher(tmp_path, seeds=(0, 1, 2), n_configs=2)  # pack 1: a Tune trial per seed
    configs = [s.suggest(f"t{i}") for i in range(6)]
    members = [split_search_config(c["members"][0]) for c in configs]
    assert all(len(c["members"]) == 1 for c in configs)
    by_number: dict[int, list[dict]] = {}
    for flat, number in members:
        by_number.setdefault(number, []).append(flat)
    assert sorted(by_number) == [0, 1]
    assert [sorted(f["seed"] for f in flats) for flats in by_number.values()] == [[0, 1, 2]] * 2
    assert {f["lr"] for f in by_number[0]} == {1e-3}  # the paper's lr, first and exact
    assert len({f["lr"] for f in by_number[1]}) == 1 and by_number[1][0]["lr"] != 1e-3

    values = {}
    for i, config in enumerate(configs[:5]):
        values.update(finish(s, f"t{i}", config))
    trials = study(tmp_path).trials
    assert trials[0].state == optuna.trial.TrialState.COMPLETE  # all three seeds in
    assert trials[1].state == optuna.trial.TrialState.RUNNING  # one seed still out
    values.update(finish(s, "t5", configs[5]))
    for number, flats in by_number.items():
        expected = sum(values[config_trial_id("s", f)] for f in flats) / 3
        assert study(tmp_path).trials[number].value == pytest.approx(expected)
    assert s.suggest("t7") == "FINISHED"


def test_a_seed_without_a_value_fails_the_configuration(tmp_path):
    s = searcher(tmp_path, seeds=(0, 1), n_configs=1)
    first = s.suggest("a")
    assert s.suggest("b") is not None  # the second seed
    finish(s, "a", first)
    s.on_trial_complete("b", error=True)  # its retries exhausted
    (trial,) = study(tmp_path).trials
    assert trial.state == optuna.trial.TrialState.FAIL
    assert seed_mean([0.5, math.nan]) is None and seed_mean([0.5, 0.7]) == pytest.approx(0.6)


def test_a_diverged_seed_fails_the_configuration_whatever_its_value(tmp_path):
    """A seed that diverged after its first evaluation still has a best_val_accuracy; its
    configuration is told FAIL all the same (it cannot win on its other seeds)."""
    s = searcher(tmp_path, seeds=(0, 1), n_configs=1)
    first, second = s.suggest("a"), s.suggest("b")
    finish(s, "a", first, value=0.99)
    finish(s, "b", second, value=0.99, status="diverged")
    (trial,) = study(tmp_path).trials
    assert trial.state == optuna.trial.TrialState.FAIL


def test_packable_arm_asks_several_configurations_into_one_cohort(tmp_path):
    arms = [{**BASE, "init": "pretrained", "seed": s} for s in (0, 1)]
    assert configs_per_ask(arms, pack=6) == 3  # two seeds share a cohort: 3 configurations
    random_arms = [{**a, "init": "random"} for a in arms]
    assert configs_per_ask(random_arms, pack=6) == 6  # one seed per cohort (own backbone)
    assert configs_per_ask([{**a, "finetune": "full"} for a in arms], pack=6) == 1

    s = searcher(tmp_path, seeds=(0, 1), pack=6, n_configs=3)
    (config,) = [s.suggest("t0")]
    tagged = [split_search_config(m) for m in config["members"]]
    assert len(tagged) == 6 and sorted({n for _, n in tagged}) == [0, 1, 2]
    assert s.suggest("t1") == "FINISHED"  # all three asked at once
    finish(s, "t0", config)
    assert [t.state.name for t in study(tmp_path).trials] == ["COMPLETE"] * 3


def test_random_init_cohorts_hold_one_seed_and_several_configurations(tmp_path):
    s = searcher(tmp_path, seeds=(0, 1), init="random", pack=4, n_configs=4)
    configs = [s.suggest("t0"), s.suggest("t1")]
    for config in configs:
        flats = [split_search_config(m)[0] for m in config["members"]]
        assert len(flats) == 4 and len({f["seed"] for f in flats}) == 1
    assert {split_search_config(m)[0]["seed"] for c in configs for m in c["members"]} == {0, 1}


def test_saved_searcher_resumes_and_abandoned_trials_are_failed(tmp_path):
    s = searcher(tmp_path, seeds=(0, 1), n_configs=3)
    configs = {f"t{i}": s.suggest(f"t{i}") for i in range(4)}  # configurations 0 and 1
    finish(s, "t0", configs["t0"])
    finish(s, "t1", configs["t1"])
    s.save(str(tmp_path / "state.pkl"))

    restored = searcher(tmp_path, seeds=(0, 1), n_configs=3)  # as Tune: unpickle, restore
    restored.restore(str(tmp_path / "state.pkl"))
    finish(restored, "t2", configs["t2"])
    finish(restored, "t3", configs["t3"])
    more = [restored.suggest(f"u{i}") for i in range(2)]  # configuration 2
    assert {split_search_config(c["members"][0])[1] for c in more} == {2}
    assert restored.suggest("u2") == "FINISHED"
    states = [t.state.name for t in study(tmp_path).trials]
    assert states == ["COMPLETE", "COMPLETE", "RUNNING"]

    # A later run that does not resume: the trial the old run left RUNNING is failed, and
    # the study goes on with new configurations.
    later = searcher(tmp_path, seeds=(0, 1), n_configs=1)
    config = later.suggest("v0")
    assert [t.state.name for t in study(tmp_path).trials][:3] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert split_search_config(config["members"][0])[1] == 3


def test_a_repeated_configuration_is_told_its_first_value_without_training(tmp_path):
    s = searcher(tmp_path, seeds=(0,), n_configs=3, batch_size=("choice", [16]))
    first = s.suggest("t0")
    assert s.suggest("t1") is None  # the repeat waits for the first, untrained
    finish(s, "t0", first, value=0.75)
    assert s.suggest("t2") is None  # the third is a repeat too: told at once
    assert s.suggest("t3") == "FINISHED"
    values = [t.value for t in study(tmp_path).trials]
    assert values == [0.75, 0.75, 0.75]


def test_seed_groups_fold_seeds_of_each_arm():
    sweep = SweepConfig(name="s", base=BASE, grid={"init": ["pretrained", "random"]}, seeds=(0, 1))
    trials = sweep.trials()
    groups = seed_groups(trials)
    assert groups == [[0, 1], [2, 3]]
    assert [[trials[i]["seed"] for i in g] for g in groups] == [[0, 1], [0, 1]]
    assert [trials[g[0]]["init"] for g in groups] == ["pretrained", "random"]
    assert SEARCH_CONFIG == "search_config"


@pytest.mark.slow
def test_packed_search_end_to_end_trains_every_seed_and_continues(tmp_path, tiny_gpt2_dir):
    """A real search through a local Ray: 3 configurations x 2 seeds of a pretrained FPT arm
    in one packed Tune trial; the study's values are the seed means of the Parquet rows; a
    resume restores the searcher, a later run continues the study."""
    import dataclasses

    from scale_fpt.results import load_results
    from scale_fpt.sweep import run_sweep

    sweep = SweepConfig(
        name="lrfair",
        base={**BASE, "model": tiny_gpt2_dir, "init": "pretrained", "test_batches": 2},
        search={"lr": ("loguniform", 1e-4, 1e-2)},
        seeds=(0, 1),
        search_trials=3,
        pack=6,
        results_dir=str(tmp_path),
        max_concurrent=1,
    )
    outcome = run_sweep(sweep)
    assert outcome.finished and outcome.trials == 1  # 3 configurations x 2 seeds: one cohort

    def check(n_configs: int):
        trials = load_results(tmp_path, "lrfair").trials
        assert len(trials) == 2 * n_configs and (trials["status"] == "completed").all()
        per_config = trials.groupby("search_config")
        assert sorted(per_config.groups) == list(range(n_configs))
        assert per_config["seed"].apply(sorted).tolist() == [[0, 1]] * n_configs
        assert (per_config["lr"].nunique() == 1).all()
        assert (trials.loc[trials["search_config"] == 0, "lr"] == 1e-3).all()  # exactly
        means = per_config[sweep.metric].mean()
        storage = f"sqlite:///{tmp_path / 'lrfair' / 'optuna.db'}"
        (summary,) = optuna.get_all_study_summaries(storage)
        trials_done = optuna.load_study(study_name=summary.study_name, storage=storage).trials
        assert [t.number for t in trials_done] == list(range(n_configs))
        for trial in trials_done:
            assert trial.value == pytest.approx(means[trial.number])
            assert trial.params["lr"] == per_config["lr"].first()[trial.number]
        return trials

    first = check(3)
    assert run_sweep(sweep, resume=True).trials == 1  # restored: nothing new to run
    check(3)
    second = run_sweep(dataclasses.replace(sweep, search_trials=2))  # the study continues
    assert second.finished and second.trials == 1
    rows = check(5)
    assert rows["lr"].nunique() == 5
    assert first.set_index("trial_id")["lr"].to_dict().items() <= (
        rows.set_index("trial_id")["lr"].to_dict().items()
    )


@pytest.mark.slow
@pytest.mark.faults
def test_interrupted_search_resumes_tells_each_configuration_once_and_continues(tmp_path):
    """Ctrl-C mid-search (one seed's Tune trial running, the configuration half scored):
    --resume restores the searcher, finishes the seeds, and every configuration is told
    once, its seed mean, with each (configuration, seed) one row (a Tune trial per seed:
    unpacked). A later run continues the same Optuna study in its SQLite storage, with new
    configurations (none replayed), each seed's value and row kept as user attributes."""
    import dataclasses
    import os
    import signal
    import threading
    import time

    from scale_fpt.results import load_results
    from scale_fpt.sweep import run_sweep

    sweep = SweepConfig(
        name="cut",
        base={**BASE, "init": "random", "max_steps": 60, "eval_every": 10, "test_batches": 2},
        search={"lr": ("loguniform", 1e-4, 1e-2)},
        seeds=(0, 1),
        search_trials=2,
        pack=1,
        results_dir=str(tmp_path),
        max_concurrent=1,
    )
    curves = tmp_path / "cut" / "curves"

    def interrupt_during_the_second_tune_trial():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if len(list(curves.glob("[!.]*.parquet"))) >= 2:  # the second seed has begun
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)  # soon after: 5 reports of the trial are still to come

    thread = threading.Thread(target=interrupt_during_the_second_tune_trial, daemon=True)
    thread.start()
    interrupted = run_sweep(sweep)
    thread.join()
    assert not interrupted.finished
    storage = f"sqlite:///{tmp_path / 'cut' / 'optuna.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert [t.state.name for t in study.trials] == ["RUNNING"]  # seed 1 still out

    resumed = run_sweep(sweep, resume=True)
    assert resumed.finished and resumed.experiments == interrupted.experiments
    trials = load_results(tmp_path, "cut").trials
    assert len(trials) == 4 and (trials["status"] == "completed").all()
    assert trials.groupby("search_config")["seed"].apply(sorted).tolist() == [[0, 1], [0, 1]]
    means = trials.groupby("search_config")[sweep.metric].mean()
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for trial in study.trials:
        assert trial.value == pytest.approx(means[trial.number])

    later = run_sweep(dataclasses.replace(sweep, search_trials=1))  # the same study continues
    assert later.finished and later.experiments == interrupted.experiments
    assert len(optuna.get_all_study_summaries(storage)) == 1
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    lrs = [t.params["lr"] for t in study.trials]
    assert len(set(lrs)) == 3, "the continued study replayed earlier suggestions"
    trials = load_results(tmp_path, "cut").trials
    assert sorted(trials["lr"]) == sorted(lrs * 2)  # every Optuna trial: a row per seed
    means = trials.groupby("search_config")[sweep.metric].mean()
    rows = trials.set_index("trial_id")
    for trial in study.trials:
        assert trial.value == pytest.approx(means[trial.number])
        # each seed's value and Parquet row, as user attributes
        ids, values = trial.user_attrs["trial_ids"], trial.user_attrs["seed_values"]
        assert sorted(ids) == sorted(values) == ["0", "1"]
        for seed, trial_id in ids.items():
            assert rows.loc[trial_id, "seed"] == int(seed)
            assert values[seed] == pytest.approx(rows.loc[trial_id, sweep.metric])


def test_arm_searchers_interleave_arms_and_route_results(tmp_path):
    """Two searched arms in one experiment: Tune's successive asks alternate between the
    arms (each waits for its own results), each result goes to the arm that suggested it,
    and the whole search is finished when both arms are; a save/restore keeps it all."""
    import pickle

    from scale_fpt.search import ArmSearchers

    def arm(finetune: str) -> SeedMeanSearcher:
        return SeedMeanSearcher(
            sweep="s",
            seed_arms=[{**BASE, "init": "random", "finetune": finetune, "seed": 0}],
            search={"lr": ("loguniform", 1e-5, 1e-2)},
            study_name=f"s-{finetune}",
            storage_url=f"sqlite:///{tmp_path / 'optuna.db'}",
            n_configs=2,
            parallel=1,
            metric=METRIC,
        )

    both = ArmSearchers([arm("fpt"), arm("full")], METRIC)
    first, second = both.suggest("t1"), both.suggest("t2")
    assert [m["finetune"] for c in (first, second) for m in c["members"]] == ["fpt", "full"]
    assert both.suggest("t3") is None  # each arm waits for its one running configuration
    finish(both, "t2", second)
    both = pickle.loads(pickle.dumps(both))  # Tune saves and restores the searcher
    third = both.suggest("t3")
    assert [m["finetune"] for m in third["members"]] == ["full"]
    finish(both, "t1", first)
    finish(both, "t3", third)
    fourth = both.suggest("t4")
    assert [m["finetune"] for m in fourth["members"]] == ["fpt"]
    finish(both, "t4", fourth)
    assert both.suggest("t5") == "FINISHED"
    for name in ("s-fpt", "s-full"):
        trials = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
        assert [t.state.name for t in trials.trials] == ["COMPLETE", "COMPLETE"]
