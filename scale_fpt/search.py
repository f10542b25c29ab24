"""Learning-rate-fair searches: one Optuna study per arm, every configuration trained for
every seed and scored on the mean over those seeds.

    SeedMeanSearcher (a Ray Tune ``Searcher``, one per arm):
        study.ask() x K   (K configurations at once where the arm packs; the arm's own lr,
                           the paper's 1e-3 by default, enqueued first in a new study)
        -> members: every configuration x every seed of the sweep, each member a flat trial
           config tagged with its ``search_config`` (the Optuna trial number)
        -> packing.cohorts(members, pack): one Tune trial per cohort (the seeds, and the K
           configurations, of a pretrained FPT arm share one frozen body; arms that cannot
           pack get one Tune trial per seed, which run side by side)
        -> each Tune trial's final ``trial_rows`` -> per configuration, once all its seeds
           are in: study.tell(mean of the seeds' ``metric``)   (any seed that did not
           complete, diverged included, or has no finite value: the configuration is told
           FAIL, which the sampler leaves out)

A configuration is never trained twice: one equal to an earlier configuration of the study
(a repeated categorical draw) is told that configuration's value. The searcher's state
(what was asked, which Tune trials hold which members, the values so far) is saved by Tune
with the experiment, so ``--resume`` (``Tuner.restore``) continues it; the Optuna study
lives in its storage (SQLite by default), so a later run of the same sweep continues the
study. Optuna trials left RUNNING by a run that is not being resumed are told FAIL.
"""

from __future__ import annotations

import math
import pickle
import warnings
import zlib

from ray.tune.search import Searcher

from scale_fpt.config import parse_trial
from scale_fpt.packing import cohorts
from scale_fpt.profile import pack_problem
from scale_fpt.storage import open_optuna_storage
from scale_fpt.trial import SEARCH_CONFIG, config_trial_id, split_search_config
from scale_fpt.vocabulary import Status


def distributions(search: dict) -> dict:
    """Optuna distributions of a sweep's search space (field -> (kind, *args))."""
    import optuna.distributions as d

    make = {
        "loguniform": lambda lo, hi: d.FloatDistribution(lo, hi, log=True),
        "uniform": lambda lo, hi: d.FloatDistribution(lo, hi),
        "int": lambda lo, hi: d.IntDistribution(lo, hi),
        "choice": lambda values: d.CategoricalDistribution(values),
    }
    return {key: make[kind](*args) for key, (kind, *args) in search.items()}


def paper_point(arm: dict, space: dict) -> dict:
    """The arm's own values of the searched fields (lr: the paper's 1e-3, or the per-task
    value of the arm's overrides), as far as they lie in the search space: the point a new
    study evaluates first, so the table can set the paper's setting beside the best."""
    flat = parse_trial(arm).to_flat()
    point = {}
    for key, distribution in space.items():
        value = flat[key]
        if in_space(value, distribution):
            point[key] = value
        else:
            warnings.warn(
                f"search {key!r}: the arm's value {value!r} is outside the search space; "
                "the study does not evaluate it first",
                stacklevel=2,
            )
    return point


def seed_mean(values: list[float]) -> float | None:
    """The configuration's score: the mean over its seeds; None if any seed has no finite
    value (failed, or diverged before its first evaluation)."""
    if not values or not all(v is not None and math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def configs_per_ask(seed_arms: list[dict], pack: int) -> int:
    """How many configurations to ask for at once: as many as fill a cohort of ``pack``
    beside the seeds that share it (pretrained FPT arms: every seed; random or stats
    backbones: one seed per cohort); 1 where the arm does not pack."""
    if pack <= 1 or pack_problem(seed_arms[0]):
        return 1
    return max(1, pack // len(cohorts(seed_arms, pack)[0]))


class SeedMeanSearcher(Searcher):
    """Ray Tune searcher of one arm: Optuna's ask/tell, each configuration trained for every
    seed and told the seed mean of ``metric`` (see the module docstring)."""

    def __init__(
        self,
        sweep: str,
        seed_arms: list[dict],
        search: dict,
        study_name: str,
        storage_url: str,
        n_configs: int,
        pack: int = 1,
        parallel: int = 2,
        metric: str = "best_val_accuracy",
    ):
        super().__init__(metric=metric, mode="max")
        self.sweep, self.seed_arms, self.search = sweep, list(seed_arms), dict(search)
        self.study_name, self.storage_url = study_name, storage_url
        self.n_configs = n_configs
        self.pack = pack
        self.per_ask = configs_per_ask(self.seed_arms, pack)
        self.parallel = max(1, parallel) * self.per_ask
        """Configurations that may wait for results at once: ``parallel`` Tune trials'
        worth (the sampler learns from results; asking everything up front would not)."""
        self.asked = 0
        """Configurations asked of the study in this run."""
        self.queue: list[dict] = []
        """Tune configs ({"members": [...]}) asked but not yet handed to Tune."""
        self.tune_trials: dict[str, list[str]] = {}
        """Tune trial id -> trial ids of its members."""
        self.pending: dict[int, dict[str, float | None]] = {}
        """Optuna trial number -> {member trial id: value, None until its row is final}."""
        self.aliases: dict[int, list[int]] = {}
        """Optuna trial number -> later numbers with the same parameters (told its value)."""
        self.known: dict[tuple, int] = {}
        """Parameters -> the first Optuna trial number with them (this study, every run)."""
        self.optuna_ids: dict[int, int] = {}
        """Optuna trial number -> its storage id (to record user attributes at the tell)."""
        self.member_seeds: dict[str, int] = {}
        """Member trial id -> its seed."""
        self._study = None

    def remaining(self) -> int:
        """Configurations of this run not yet told to the study: never asked, or asked and
        still waiting for a seed (what an interrupted sweep leaves for ``--resume``)."""
        return self.n_configs - self.asked + len(self.pending)

    # ----------------------------------------------------------------- the study

    def __getstate__(self):  # Tune pickles the searcher with the experiment
        return {**self.__dict__, "_study": None}

    @property
    def study(self):
        if self._study is None:
            import optuna

            storage = open_optuna_storage(self.storage_url)
            existing = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage)}
            # A continued study must not replay earlier suggestions (a seeded sampler starts
            # its random draws over): offset the seed by the trials the study already has.
            seed = zlib.crc32(self.study_name.encode()) % 100_003 + existing.get(self.study_name, 0)
            self._study = optuna.create_study(
                storage=storage,
                study_name=self.study_name,
                direction="maximize",
                sampler=optuna.samplers.TPESampler(seed=seed, constant_liar=True),
                load_if_exists=True,
            )
            if self.study_name not in existing:
                self._study.enqueue_trial(
                    paper_point(self.seed_arms[0], distributions(self.search))
                )
            self._settle_study()
        return self._study

    def _settle_study(self) -> None:
        """Learn the parameters tried so far; fail the trials of runs that are not resumed."""
        from optuna.trial import TrialState

        for trial in self._study.get_trials(deepcopy=False):
            if trial.state == TrialState.RUNNING and trial.number not in self.pending:
                self._study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            elif trial.state in (TrialState.COMPLETE, TrialState.RUNNING):
                self.known.setdefault(params_key(trial.params), trial.number)

    # ----------------------------------------------------------------- Tune's side

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the space, metric and mode are the sweep's, given at construction

    def suggest(self, trial_id: str):
        if not self.queue:
            if self.asked >= self.n_configs:
                return Searcher.FINISHED
            if len(self.pending) >= self.parallel:
                return None  # wait for results: the sampler learns from them
            self._ask()
            if not self.queue:
                return None
        config = self.queue.pop(0)
        self.tune_trials[trial_id] = [
            config_trial_id(self.sweep, split_search_config(m)[0]) for m in config["members"]
        ]
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        members = self.tune_trials.get(trial_id)
        if members is None:
            return
        if error:
            values = dict.fromkeys(members, math.nan)
        elif not result or not result.get("final"):
            return  # stopped before its end (an interrupted sweep): a resume runs it on
        else:
            rows = {row["trial_id"]: row for row in result.get("trial_rows", [])}
            values = {m: row_value(rows.get(m), self.metric) for m in members}
        del self.tune_trials[trial_id]
        for number, seeds in list(self.pending.items()):
            seeds.update({m: v for m, v in values.items() if m in seeds})
            if all(v is not None for v in seeds.values()):
                self._tell(number, seed_mean(list(seeds.values())))

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__getstate__(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))

    # ----------------------------------------------------------------- ask and tell

    def _ask(self) -> None:
        """Ask the study for up to ``per_ask`` configurations; queue their members' cohorts."""
        space = distributions(self.search)
        members, numbers = [], {}
        for _ in range(min(self.per_ask, self.n_configs - self.asked)):
            trial = self.study.ask(space)
            self.asked += 1
            earlier = self.known.setdefault(params_key(trial.params), trial.number)
            if earlier != trial.number:  # the same configuration again: never train it twice
                self.aliases.setdefault(earlier, []).append(trial.number)
                if earlier not in self.pending:
                    self._tell_aliases(earlier)
                continue
            self.pending[trial.number] = {}
            # Trial._trial_id: the storage's id, which optuna.trial.Trial(study, id) takes.
            self.optuna_ids[trial.number] = trial._trial_id
            for arm in self.seed_arms:
                flat = {**arm, **trial.params}
                member = config_trial_id(self.sweep, flat)
                self.pending[trial.number][member] = None
                self.member_seeds[member] = arm.get("seed", 0)
                members.append(flat)
                numbers[id(flat)] = trial.number
        for cohort in cohorts(members, self.pack) if members else []:
            self.queue.append({"members": [{**m, SEARCH_CONFIG: numbers[id(m)]} for m in cohort]})

    def _tell(self, number: int, value: float | None) -> None:
        import optuna
        from optuna.trial import TrialState

        # What each seed scored and which Parquet rows hold it, beside the told mean: user
        # attributes, shown by optuna-dashboard and in study.trials_dataframe().
        seeds = self.pending[number]
        trial = optuna.trial.Trial(self.study, self.optuna_ids.pop(number))
        trial.set_user_attr(
            "seed_values",
            {str(self.member_seeds[m]): (None if math.isnan(v) else v) for m, v in seeds.items()},
        )
        trial.set_user_attr("trial_ids", {str(self.member_seeds[m]): m for m in seeds})
        if value is None:
            self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        else:
            self.study.tell(number, value, skip_if_finished=True)
        del self.pending[number]
        self._tell_aliases(number)

    def _tell_aliases(self, number: int) -> None:
        """Tell the repeats of configuration ``number`` its (final) value."""
        from optuna.trial import TrialState

        trial = self.study.get_trials(deepcopy=False)[number]
        for alias in self.aliases.pop(number, []):
            if trial.state == TrialState.COMPLETE:
                self.study.tell(alias, trial.value, skip_if_finished=True)
            else:
                self.study.tell(alias, state=TrialState.FAIL, skip_if_finished=True)


def in_space(value, distribution) -> bool:
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return value in choices
    return distribution.low <= value <= distribution.high


def params_key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def row_value(row: dict | None, metric: str) -> float:
    """A member's final ``metric`` from its trial row: NaN when missing or when the member
    did not complete (a diverged seed fails its configuration, so a rate that diverged in
    some seeds cannot win on its survivors)."""
    value = (row or {}).get(metric)
    if value is None or (row or {}).get("status") != Status.COMPLETED:
        return math.nan
    return float(value)


class ArmSearchers(Searcher):
    """Every searched arm of a sweep in one Tune experiment: Tune asks each arm's
    ``SeedMeanSearcher`` in turn for its next configuration, so the arms run side by side
    and the cluster stays full instead of draining at the end of each arm. Each arm keeps
    its own Optuna study; results go back to the arm that suggested the trial."""

    def __init__(self, arms: list[SeedMeanSearcher], metric: str = "best_val_accuracy"):
        super().__init__(metric=metric, mode="max")
        self.arms = list(arms)
        self.owner: dict[str, int] = {}
        """Tune trial id -> the index of the arm that suggested it."""
        self.finished: set[int] = set()
        self.next_arm = 0

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        for offset in range(len(self.arms)):
            index = (self.next_arm + offset) % len(self.arms)
            if index in self.finished:
                continue
            config = self.arms[index].suggest(trial_id)
            if config == Searcher.FINISHED:
                self.finished.add(index)
            elif config is not None:
                self.owner[trial_id] = index
                self.next_arm = (index + 1) % len(self.arms)
                return config
        return Searcher.FINISHED if len(self.finished) == len(self.arms) else None

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        index = self.owner.pop(trial_id, None)
        if index is not None:
            self.arms[index].on_trial_complete(trial_id, result=result, error=error)

    def remaining(self) -> int:
        """``SeedMeanSearcher.remaining`` of every arm."""
        return sum(arm.remaining() for arm in self.arms)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__getstate__(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__setstate__(pickle.load(f))

    def __getstate__(self):
        return {**self.__dict__, "arms": [arm.__getstate__() for arm in self.arms]}

    def __setstate__(self, state):
        arms = []
        for arm_state in state["arms"]:
            arm = SeedMeanSearcher.__new__(SeedMeanSearcher)
            arm.__dict__.update(arm_state)
            arms.append(arm)
        self.__dict__.update({**state, "arms": arms})
