"""Attention maps of trained bit-task models (the paper's Figures 3-4).

A trial's checkpoint holds its trainable weights only (DeepSpeed, frozen parameters
excluded); the frozen ones are rebuilt from the trial's config and seed by ``build_model``,
here with eager attention so the backbone returns its attention probabilities. On a fixed
batch of the task's test set, the attention of every layer is averaged over heads and
examples: ``maps[layer, t, s]`` is how much output position t attends to input position s.

Which inputs an output token needs (``relevant_positions``, from ``scale_fpt.tasks.bits``):
- bit-xor: output token 5+i predicts a_i XOR b_i, so it needs tokens i (a_i) and 5+i (b_i).
- bit-memory: query token 100+j holds patch j of the masked query string; its answer is
  patch j of one of the five stored strings: tokens j, 20+j, 40+j, 60+j, 80+j.
``attention_shares`` reports, per output token, the attention mass on those positions in the
last layer and averaged over layers, beside what uniform causal attention would give.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from scale_fpt.checkpoints import load_weights, weights_file
from scale_fpt.config import FIELD_TYPES, TaskConfig, TrialConfig
from scale_fpt.confined import inside, printable
from scale_fpt.report.tables import SELECTION
from scale_fpt.results import checkpoint_dir, results_root
from scale_fpt.tasks.bits import BitMemory, BitXor

ATTENTION_TASKS = ("bit-xor", "bit-memory")


def relevant_positions(config: TaskConfig) -> dict[int, list[int]]:
    """Output position -> the input positions its prediction depends on."""
    if config.task == "bit-xor":
        n = BitXor.n_bits
        return {n + i: [i, n + i] for i in range(n)}
    if config.task == "bit-memory":
        q = config.bit_memory_bits // config.bit_memory_patch  # tokens per string (20)
        start = BitMemory.n_strings * q  # first query token (100)
        return {start + j: [s * q + j for s in range(BitMemory.n_strings)] for j in range(q)}
    raise ValueError(f"no attention analysis for task {config.task!r} (only {ATTENTION_TASKS})")


@torch.no_grad()
def attention_maps(module, x: torch.Tensor) -> np.ndarray:
    """(layers, T, T) attention of an ``FPT`` on inputs ``x``, averaged over heads and the
    batch. The backbone must be built with ``attn_implementation='eager'``."""
    was_training = module.training
    module.eval()
    try:
        _, attentions = module.hidden(x, output_attentions=True)
    finally:
        module.train(was_training)
    if not attentions or any(a is None for a in attentions):
        raise ValueError(
            "the backbone returned no attention probabilities; build it with "
            "build_model(config, spec, attn_implementation='eager')"
        )
    stacked = torch.stack([a.float() for a in attentions])  # (L, B, H, T, T)
    return stacked.mean(dim=(1, 2)).cpu().numpy()


def attention_shares(maps: np.ndarray, relevant: dict[int, list[int]]) -> pd.DataFrame:
    """Per output token: attention on its relevant positions in the last layer
    (``share_last_layer``), averaged over layers (``share_mean_layers``), per layer
    (``share_layer_<l>``), and what uniform attention over the causal prefix would give."""
    rows = []
    for t, positions in relevant.items():
        per_layer = maps[:, t, positions].sum(axis=1)  # (L,)
        row = {
            "output_position": t,
            "relevant_positions": " ".join(map(str, positions)),
            "share_last_layer": float(per_layer[-1]),
            "share_mean_layers": float(per_layer.mean()),
            "uniform_share": sum(p <= t for p in positions) / (t + 1),
        }
        row.update({f"share_layer_{i}": float(v) for i, v in enumerate(per_layer)})
        rows.append(row)
    return pd.DataFrame(rows)


def trained_weights_path(row, results_dir: str | Path | None = None) -> Path:
    """The trial's trained-weights file (``checkpoints.weights_file``) in its ``checkpoint``
    directory (``results.checkpoint_dir``: under the results directory, else refused); the
    file itself, links followed, must lie there too."""
    root = results_root(results_dir or ".")
    path = checkpoint_dir(row["checkpoint"], root) / weights_file(row["trial_id"])
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} under checkpoint {printable(row['checkpoint'])}")
    return inside(root, path)


def trial_config(row) -> TrialConfig:
    """The TrialConfig of a trials row (its config columns)."""
    flat = {}
    for name in FIELD_TYPES:
        value = row.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        flat[name] = value.item() if hasattr(value, "item") else value
    return TrialConfig.from_flat(flat)


def load_trial_model(row, results_dir: str | Path | None = None):
    """(FPT module in eval mode with eager attention and the trial's trained weights, its
    task).

    Raises ValueError when the checkpoint does not hold exactly the trainable parameters."""
    from scale_fpt.models import build_model
    from scale_fpt.tasks import build_task

    path = trained_weights_path(row, results_dir)
    config = trial_config(row)
    task = build_task(config.task, config.train.seed)
    built = build_model(config, task.spec, attn_implementation="eager")
    state = load_weights(path)  # refuses anything but tensors
    wpe = "backbone.wpe.weight"
    if wpe in state:  # a packed trial keeps the task's T rows; the rows past T never train
        rows = state.pop(wpe)
        with torch.no_grad():
            built.module.get_parameter(wpe)[: len(rows)].copy_(rows)
        trained_rows = {wpe}
    else:
        trained_rows = set()
    _, unexpected = built.module.load_state_dict(state, strict=False)
    trainable = {n for n, p in built.module.named_parameters() if p.requires_grad}
    missing = sorted(trainable - set(state) - trained_rows)
    if unexpected or missing:
        raise ValueError(
            f"checkpoint {row['checkpoint']} does not match the trial's model: "
            f"unexpected {unexpected[:5]}, missing trainable {missing[:5]}"
        )
    return built.module.eval(), task


def test_inputs(task, n_examples: int = 32) -> torch.Tensor:
    """The first ``n_examples`` inputs of the task's fixed test set."""
    return next(iter(task.test_batches(n_examples))).x


def trial_attention(row, results_dir=None, n_examples: int = 32) -> dict:
    """{maps (L, T, T), shares DataFrame, relevant positions, n_examples} of one trial."""
    module, task = load_trial_model(row, results_dir)
    x = test_inputs(task, n_examples)
    maps = attention_maps(module, x)
    relevant = relevant_positions(trial_config(row).task)
    return {
        "maps": maps,
        "shares": attention_shares(maps, relevant),
        "relevant": relevant,
        "n_examples": len(x),
    }


ATTENTION_LIMIT = 8
"""Trials whose attention the report draws at most: one per arm, so the section's cost stays
a few seconds a trial whatever the number of seeds."""


def attention_trials(
    trials: pd.DataFrame, limit: int = ATTENTION_LIMIT
) -> tuple[pd.DataFrame, int]:
    """(bit-task transformer trials with a checkpoint: the best seed (by validation accuracy,
    ``SELECTION``) of each arm, at most ``limit``; how many arms had one)."""
    if trials.empty or "checkpoint" not in trials or SELECTION not in trials:
        return trials.iloc[:0], 0
    ok = (
        trials["task"].isin(ATTENTION_TASKS)
        & (trials["model"] != "lstm")
        & trials["status"].isin(("completed", "diverged"))
        & trials["checkpoint"].notna()
        & (trials["checkpoint"].astype(str) != "")
    )
    df = trials[ok].sort_values(SELECTION, ascending=False, na_position="last")
    keys = ["task", "model", "weights", "init", "finetune", "lr", "batch_size", "max_steps"]
    arms = df.drop_duplicates(keys)
    return arms.head(limit).sort_values(["task", "model", "init"]), len(arms)
