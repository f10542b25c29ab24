"""The ``scale-fpt`` command line: train, plan, pretrain, sweep, fetch, results, report.

Trial flags are generated from the config dataclasses (``--batch-size`` is ``batch_size``),
so the command line, the sweep param space and the Parquet columns share one set of names.
Every value is checked by the config layer, which reports all problems at once; bad input
exits with code 2 and one message, never a traceback, and writes nothing.

Building the parser imports neither torch nor Ray (``scale-fpt --help`` and the list of
studies answer at once); each command imports what it runs when it is dispatched. This is
the one module of the package that imports the recipes (``scale_fpt.recipes``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import yaml

from scale_fpt import fetch as fetch_module
from scale_fpt import planner
from scale_fpt.config import CONCERNS, FIELD_TYPES, ConfigError, TrialConfig
from scale_fpt.confined import printable
from scale_fpt.flags import add_field_flags, load_mapping
from scale_fpt.gpus import DEFAULT_GPU, GPUS, gpu_with_memory
from scale_fpt.recipes import STUDY_NAMES, load_study
from scale_fpt.study import add_study_flags, narrow, run_study, sweep_flag_values
from scale_fpt.sweep.config import SweepConfig

EXIT_BAD_INPUT = 2
TRIAL_ALIASES = {"max_steps": ["--steps"]}


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so every problem can be reported together."""

    def error(self, message):
        raise ConfigError([message])


def add_trial_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per trial config field, in a group per concern (``flags.add_field_flags``)."""
    for concern in CONCERNS:
        defaults = concern()
        add_field_flags(
            parser.add_argument_group(concern.__name__),
            concern,
            {f.name: FIELD_TYPES[f.name] for f in fields(concern)},
            TRIAL_ALIASES,
            default_text=lambda name, d=defaults: repr(getattr(d, name)),
        )


def build_parser() -> Parser:
    parser = Parser(prog="scale-fpt", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    train = commands.add_parser("train", help="train one trial and write its Parquet rows")
    add_trial_flags(train)
    add_config_file_flags(train)
    train.add_argument(
        "--results",
        "--results-dir",
        "--results_dir",
        dest="results",
        default="results",
        help="results directory (default: results)",
    )
    train.add_argument("--sweep", default="train", help="sweep name of the rows (default: train)")
    train.add_argument(
        "--checkpoint-dir",
        default="",
        help="checkpoint at every evaluation, in DIR/<trial_id>/; a rerun of the same trial "
        "resumes from it",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    plan = commands.add_parser(
        "plan", help="parameter counts, FLOPs, memory and GPUs per trial; trains nothing"
    )
    add_trial_flags(plan)
    add_config_file_flags(plan)
    add_plan_flags(plan)

    pretrain = commands.add_parser("pretrain", help="pretrain a CPU-sized backbone locally")
    add_pretrain_flags(pretrain)

    sweep = commands.add_parser(
        "sweep",
        help=f"run a study ({', '.join(STUDY_NAMES)}) or a sweep declared in a YAML file",
        description="Run (or plan, or resume) a study of scale_fpt/recipes/studies.py, or a "
        "sweep declared in a YAML file of SweepConfig fields (examples/lr_grid.yaml). The same "
        "flags as the scripts in sweeps/.",
    )
    add_sweep_target(sweep, "run")

    fetch = commands.add_parser(
        "fetch",
        help="download a sweep's data and weights to where the preflight looks",
        description="Download what a sweep reads: its tasks' data into --data-root DIR "
        "(DIR/<folder>, the layout the tasks read) and its models' weights into the Hugging "
        "Face cache; what is there already is skipped. Takes the sweep's own arguments: "
        "scale-fpt fetch STUDY [flags] fetches what scale-fpt sweep STUDY [flags] reads "
        "(its other flags are accepted and ignored; docs/data.md). Exit 1 when something "
        "could not be fetched.",
    )
    add_sweep_target(fetch, "fetch")
    fetch_module.add_arguments(fetch)

    results = commands.add_parser("results", help="maintain a results directory")
    actions = results.add_subparsers(
        dest="action", metavar="{compact}", required=True, parser_class=Parser
    )
    compact = actions.add_parser(
        "compact",
        help="move ended trials' rows into a few Parquet files per sweep and table",
        description="Move the rows of ended trials from one Parquet file per trial into a "
        "few large ones per sweep and table (reading then grows with rows, not files). Safe "
        "at every moment: pandas reads every trial once throughout. Refused while a driver "
        "runs the sweep (it compacts itself). docs/usage.md, 'Results layout'.",
    )
    compact.add_argument("results_dir", metavar="RESULTS")
    compact.add_argument("--sweep", default=None, help="only this sweep (default: every one)")

    report = commands.add_parser("report", help="the study's tables and figures")
    report.add_argument("results_dir")
    report.add_argument("--out", default="", help="output directory (default: RESULTS_DIR/report)")
    report.add_argument(
        "--metric",
        default="test_accuracy",
        choices=["test_accuracy", "val_accuracy", "final_test_accuracy"],
        help="accuracy of a trial in the tables (default: test_accuracy, the test accuracy "
        "at the evaluation with the best validation accuracy)",
    )
    report.add_argument(
        "--threshold",
        action="append",
        default=[],
        help="steps-to-threshold accuracy: X for every task or TASK=X (repeatable; default: "
        "90%% of the paper's FPT accuracy per task)",
    )
    report.add_argument(
        "--no-attention", action="store_true", help="skip the attention maps of checkpoints"
    )
    report.add_argument(
        "--pool",
        action="store_true",
        help="pool the trials of every sweep into shared cells and scaling laws (default: a "
        "sweep's trials are never pooled with another's; pooled seeds may repeat and share "
        "random streams)",
    )
    report.add_argument(
        "--seeds-for",
        type=float,
        default=None,
        metavar="PP",
        help="also say, for every comparison, how many seeds detect a difference of PP "
        "percentage points at 80%% power, planned at the upper 80%% confidence bound of the "
        "results' paired SD (a pilot's: reached in at least 80%% of pilots) and at the "
        "family's Benjamini-Hochberg level",
    )
    return parser


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU plan")
    group.add_argument(
        "--gpu",
        default="",
        help=f"the GPU to plan for: {', '.join(GPUS)} (default: {DEFAULT_GPU})",
    )
    group.add_argument(
        "--gpu-memory",
        "--gpu-memory-gb",
        dest="gpu_memory",
        type=float,
        default=0.0,
        help="GiB of that GPU (default: the table's)",
    )
    group.add_argument(
        "--gpus-per-trial",
        default="auto",
        help="auto (fewest GPUs that hold the trial), N, or a fraction (default: auto)",
    )
    group.add_argument(
        "--max-gpus", type=int, default=8, help="most GPUs one trial may span (default: 8)"
    )


def add_pretrain_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="gpt2-tiny",
        help="a CPU preset (an unknown name lists them; default: gpt2-tiny)",
    )
    parser.add_argument(
        "--corpus",
        default="language",
        help="'language' (English text), 'bit-memory', or a text file / directory of text",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps (default: the preset's, 800 for most)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64, help="bytes per language sequence")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="output directory (default: the preset cache)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")


def add_sweep_target(parser: argparse.ArgumentParser, verb: str) -> None:
    """The sweep a command runs or reads: a study (``scale_fpt.recipes``) or a YAML file, and
    the flags that narrow it (``study.add_study_flags``)."""
    parser.add_argument(
        "target",
        nargs="?" if verb == "fetch" else None,
        default="",
        metavar="STUDY|FILE.yaml",
        help=f"{verb} a study: {', '.join(STUDY_NAMES)}; or a YAML file of SweepConfig fields"
        + (
            "; without it: the data of --tasks and the weights of --models (with --inits, "
            "default pretrained)"
            if verb == "fetch"
            else ""
        ),
    )
    add_study_flags(parser, presets=None, default_preset=None)


def add_config_file_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("config file")
    group.add_argument(
        "--config",
        default="",
        metavar="FILE.yaml",
        help="trial config fields from a YAML mapping (what --print-config writes); flags "
        "given beside it win",
    )
    group.add_argument(
        "--print-config",
        action="store_true",
        help="print the trial's full config as YAML (every field) and exit; runs nothing",
    )


def trial_config(args: argparse.Namespace) -> TrialConfig:
    """The trial of ``--config`` FILE's fields and the trial flags beside it (which win),
    typed and checked at once by ``TrialConfig.from_flat``."""
    flat = {}
    if args.config:
        try:
            flat = load_mapping(args.config, "trial config file", "trial config fields")
        except ConfigError as e:
            raise ConfigError([f"--config {p}" for p in e.problems]) from None
    flat.update({k: v for k, v in vars(args).items() if k in FIELD_TYPES and v is not None})
    return TrialConfig.from_flat(flat)


def print_config(config: TrialConfig) -> int:
    print(yaml.safe_dump(config.to_flat(), sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        problems = [
            f"unknown argument {u!r} (see scale-fpt {args.command} --help)" for u in unknown
        ]
        if args.command in ("train", "plan"):
            try:
                config = trial_config(args)
            except ConfigError as e:
                problems += e.problems
        if args.command == "plan":
            problems += plan_flag_problems(args)
        if problems:
            raise ConfigError(problems)
        if args.command in ("train", "plan") and args.print_config:
            return print_config(config)
        if args.command in ("train", "plan"):
            # The trial stack loads torch: imported when a trial runs or is planned, not for
            # --help (start-up time).
            from scale_fpt import trial_commands
        if args.command == "train":
            return trial_commands.train(args, config)
        if args.command == "plan":
            return trial_commands.plan(config, gpu_plan(args, config))
        if args.command == "sweep":
            declared, after = declared_sweep(args)
            return run_study(declared, args, after)
        if args.command == "fetch":
            if args.target:
                sweep = narrow(declared_sweep(args)[0], args).validate()
                return fetch_module.main(args, sweep, sweep.data_root)
            values, problems = sweep_flag_values(args)
            if problems:
                raise ConfigError(problems)
            return fetch_module.main(args, None, values.get("data_root", ""))
        if args.command == "results":
            return compact_results(args.results_dir, args.sweep)
        # pretrain and report are imported when dispatched, not at the top: they load torch
        # and pandas, and building the parser (--help) needs neither (start-up time).
        if args.command == "pretrain":
            from scale_fpt import pretrain as pretrain_module

            return pretrain_module.main(args)
        from scale_fpt import report as report_module

        return report_module.main(args)
    except ConfigError as e:
        # Problems may quote a results folder's names: each line printable, none added.
        lines = "\n".join(printable(line) for line in str(e).split("\n"))
        print(f"scale-fpt: error: {lines}", file=sys.stderr)
        return EXIT_BAD_INPUT


def compact_results(results_dir: str, sweep: str | None) -> int:
    """``scale-fpt results compact``: each sweep under the driver lock a driver takes."""
    # pyarrow is imported when dispatched: building the parser (--help) does not need it.
    from scale_fpt.compaction import listing, recover
    from scale_fpt.results import ResultsError, ResultsWriter, sweep_dirs
    from scale_fpt.sweep.lock import driver_lock

    dirs = sweep_dirs(results_dir)
    if sweep is not None:
        names = [d.name for d in dirs]
        dirs = [d for d in dirs if d.name == sweep]
        if not dirs:
            raise ResultsError(
                [f"--sweep {sweep!r}: no such sweep in {results_dir} (sweeps: {names or 'none'})"]
            )
    if not dirs:
        raise ResultsError([f"no scale_fpt results under {results_dir} (no */_schema.json)"])
    for sweep_dir in dirs:
        with driver_lock(sweep_dir):
            recover(sweep_dir)
            done = ResultsWriter(sweep_dir.parent, sweep_dir.name).compact()
        files = {table: listing(sweep_dir / table) for table in ("trials", "curves")}
        counts = {table: len(f.small) + len(f.parts) for table, f in files.items()}
        print(
            f"{sweep_dir.name}: {done.trials} trials and {done.curves} curves compacted; "
            f"trials/ holds {counts['trials']} files, curves/ {counts['curves']}"
        )
    return 0


def declared_sweep(args: argparse.Namespace) -> tuple[SweepConfig, Callable | None]:
    """(The SweepConfig ``args.target`` declares: the study's preset (``--preset``, default
    local) or the YAML file's sweep, before the narrowing flags; what the study does once a
    run has finished, if anything)."""
    target = args.target
    if target in STUDY_NAMES:
        study = load_study(target)
        if (args.preset or "local") not in study.presets:
            raise ConfigError(
                [f"--preset {args.preset}: {target} has the presets {', '.join(study.presets)}"]
            )
        return study.presets[args.preset or "local"](), study.after
    if not (target.endswith((".yaml", ".yml")) or Path(target).is_file()):
        raise ConfigError(
            [f"sweep {target!r}: neither a study ({', '.join(STUDY_NAMES)}) nor a YAML sweep file"]
        )
    if args.preset:
        raise ConfigError(
            [f"--preset {args.preset}: {target} declares its own sweep; presets are the studies'"]
        )
    return SweepConfig.from_yaml(target), None


def plan_flag_problems(args: argparse.Namespace) -> list[str]:
    problems = [] if args.max_gpus >= 1 else [f"--max-gpus: must be >= 1, got {args.max_gpus}"]
    if args.gpu and args.gpu not in GPUS and not args.gpu_memory > 0:
        problems.append(
            f"--gpu: unknown GPU {args.gpu!r}; choose from {', '.join(GPUS)} "
            "(or give --gpu-memory GiB)"
        )
    try:
        planner.parse_gpus_per_trial(args.gpus_per_trial)
    except ConfigError as e:
        problems += e.problems
    return problems


def gpu_plan(args: argparse.Namespace, config: TrialConfig):
    """The trial alone as a sweep would run it on ``--gpu`` (``sweep.plan.PlannedCohort``:
    its step and that step's memory; flags checked by ``plan_flag_problems``)."""
    # The plan builds models (torch) and names Ray's bundles: imported when a plan is made,
    # not for --help (start-up time).
    from scale_fpt.cluster import GPUOffer
    from scale_fpt.packing import Devices
    from scale_fpt.profile import config_profile
    from scale_fpt.sweep import SweepConfig
    from scale_fpt.sweep.plan import placement_on, plan_cohort

    name = args.gpu or DEFAULT_GPU
    gpu = gpu_with_memory(args.gpu_memory, name) if args.gpu_memory > 0 else GPUS[name]
    sweep = SweepConfig(name="plan", gpus_per_trial=args.gpus_per_trial)
    # One trial alone on a GPU of its own (no slots to pack for), its attention as a GPU of
    # this machine's software runs it.
    devices = Devices(gpus=1, slots=1, slot_bytes=gpu.memory_bytes)
    offer = GPUOffer(gpu, args.max_gpus, "declared")
    placement = placement_on(sweep, offer, devices, planner.gpu_fuses_attention())
    return plan_cohort([config.to_flat()], config_profile(config), placement)


if __name__ == "__main__":
    sys.exit(main())
