"""CohortStep: K >= 1 trials over one shared frozen backbone, in plain torch.

A frozen GPT-2 (FPT: ``input+output+ln+pos`` trained, attention and feed-forward frozen) is
the same for every trial of a grid that differs only in learning rate, seed (pretrained
weights) or the trained subset of input/output/ln/pos. One ``PackedFPT`` holds the frozen
weights once and every member's trained tensors with a leading member axis; one
``PackedAdam`` updates them all with each member's own learning rate, gradient clipping
and trained groups. ``packing`` decides which configs may share a cohort.

Each member is still its own trial: it draws its own training batches from its own seed,
its heads are initialised exactly as ``build_model`` does for its seed, and its dropout
masks are keyed on (its dropout seed, step, site) (``ops.step_keys``), so a member's
curve equals the same trial run alone (K = 1) to floating-point tolerance, at any dropout.
An unpacked packable trial is this step with K = 1: no DeepSpeed bookkeeping, no host sync.

The step never reads a value on the host: losses, accuracies and divergence accumulate on
the device (``MemberMetrics``). A member whose loss is not finite contributes no update
from that step on (``torch.where`` masks, not branches); the loop reads the divergence at
its next evaluation and then leaves the member out of the forward pass (``set_active``).
"""

from __future__ import annotations

import os

import torch

from scale_fpt.checkpoints import load_checkpoint_file
from scale_fpt.config import ConfigError, TrialConfig, parse_finetune
from scale_fpt.models import build_heads, check_positions, ops
from scale_fpt.models.backbones import build_backbone
from scale_fpt.models.fpt import input_dropout_p
from scale_fpt.models.packed_families import packed_model
from scale_fpt.packing import cohort_problems
from scale_fpt.runtime import DTYPES, flush_denormals, retain_freed_memory, trial_device
from scale_fpt.seeding import seed_streams
from scale_fpt.steps import MemberMetrics, evaluation_sums, member_losses, model_inputs
from scale_fpt.steps.adam import PackedAdam
from scale_fpt.steps.choice import Compilation, graph_signature, step_choice
from scale_fpt.tasks.base import Batch, Task
from scale_fpt.vocabulary import StepKind

CHECKPOINT_FILE = "cohort.pt"


class CohortStep:
    """The step of K compatible trials on one PackedFPT (see the module docstring).

    ``task``: the task built for the first member; every step draws all members' training
    batches at once (``Task.cohort_batch``: each member's stream from its own seed), and the
    fixed evaluation sets are shared."""

    rank = 0  # a cohort is one process

    def __init__(self, configs: list[TrialConfig], task: Task):
        if not configs:
            raise ValueError("a cohort needs at least one member")
        problems = cohort_problems(configs)
        if problems:
            raise ConfigError(problems)
        first = configs[0]
        self.train_config = first.train
        self.device = trial_device(first.train)
        self.dtype = DTYPES[first.train.precision]
        spec = task.spec
        backbone, d_model, n_positions = build_backbone(first.model, first.train.seed)
        check_positions(first, spec, n_positions)
        input_p = input_dropout_p(first.model, spec)
        heads = [build_heads(spec, d_model, c.train.seed, input_p) for c in configs]
        self.model = packed_model(
            backbone, spec, heads, spec.n_tokens, dtype=self.dtype, device=self.device
        )
        del backbone, heads
        # The compile mode is shared by every member (cohort_problems).
        choice = step_choice(StepKind.COHORT, first.train, torch.device(self.device).type)
        mode = choice.mode
        self.compilation = Compilation(mode, "cohort step", graph_signature(configs, self.device))
        self.forward = self.compilation.wrap(self.model)
        self.task = task.to(self.device)  # batches are drawn where the cohort trains
        self.member_seeds = [c.train.seed for c in configs]

        params = dict(self.model.named_parameters())
        groups = [parse_finetune(c.train.finetune) for c in configs]
        trains = {}
        for name, p in params.items():
            mask = [self.model.param_groups[name] in g for g in groups]
            trains[name] = torch.tensor(mask, device=self.device)
            p.requires_grad_(any(mask))  # no member trains it: no backward through it
        self.optimizer = PackedAdam(
            params,
            trains,
            lr=[c.train.lr for c in configs],
            clip=[c.train.grad_clip for c in configs],
        )
        dropout_seeds = [seed_streams(c.train.seed).dropout for c in configs]
        self.dropout_seeds = torch.tensor(dropout_seeds, device=self.device)  # (K,)
        self.metrics = MemberMetrics(len(configs), self.device)
        # Compiled, a training step is four graphs (the task's draw, the forward with loss
        # and metrics, its backward, the update) and four eager ops between them: nothing
        # per member, parameter or metric runs eagerly.
        self._losses = self.compilation.wrap(self._training_losses)
        # The update is compiled where inductor emits Triton: its CPU backend fails on this
        # graph (torch 2.13: a KeyError in its outer-loop fusion), and a CPU has no launches
        # to save.
        on_gpu = ops.on_gpu(self.optimizer.flat)
        self._update = self.compilation.wrap(self.optimizer.step, mode if on_gpu else "off")
        if choice.compiled:  # updated in place every step: CUDA graphs keep their addresses
            for t in (*self.optimizer.state_tensors(), *self.metrics.state_tensors()):
                torch._dynamo.mark_static_address(t)
        self.set_active(list(range(len(configs))))
        flush_denormals()  # as a lone trial: Adam's moments decay into slow denormals
        retain_freed_memory()

    @property
    def size(self) -> int:
        return len(self.member_seeds)

    def set_active(self, members: list[int]) -> None:
        """Train and evaluate only ``members`` from now on (the others have ended)."""
        self.active = list(members)
        everyone = len(self.active) == self.size
        self.index = None if everyone else torch.tensor(self.active, device=self.device)
        self.active_dropout_seeds = (
            self.dropout_seeds if everyone else self.dropout_seeds[self.index]
        )
        self.active_seeds = [self.member_seeds[i] for i in self.active]
        self.step_keys = ops.StepKeys(self.active_dropout_seeds)

    # ----------------------------------------------------------------- steps

    def train_step(self, step: int) -> None:
        """One step of every active member; nothing is read on the host."""
        batch = self.task.cohort_batch(step, self.train_config.batch_size, self.active_seeds)
        self.model.train()
        # (Ka,) dropout keys, made on the device: no host copy. A copy of the block's row: a
        # compiled forward then takes the same input (no storage offset) every step.
        step_keys = self.step_keys.at(step).clone()
        # Compiled, the step is a device value: one graph for every step, not one per step.
        at = torch.full((), step, device=self.device) if self.compiled else step
        self._new_graph_step()
        total, stepping = self._losses(batch, step_keys, at)
        grads = torch.autograd.grad(total, self.optimizer.params)
        self._update(grads, stepping)

    def _training_losses(
        self, batch: Batch, step_keys: torch.Tensor, step: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed loss of the members whose update counts at ``step`` (recorded in the
        metrics), and (K,) bool: which members step."""
        # x (Ka, B, T, ...), lengths (Ka, B) or None, y (Ka, B, k, m)
        x, lengths, y = model_inputs(batch, self.dtype)
        logits = self.model(x, lengths, self.index, step_keys)  # (Ka, B, k, m, C)
        loss, correct = member_losses(logits, y)  # (Ka,), (Ka,)
        counts = self.metrics.record(step, loss, correct, y[0].numel(), self.index)
        total = torch.where(counts, loss, 0.0).sum()  # a diverged member's NaNs stay out
        if self.index is None:
            return total, counts
        stepping = torch.zeros(self.size, dtype=torch.bool, device=self.device)
        return total, stepping.index_copy_(0, self.index, counts)

    def _new_graph_step(self) -> None:
        """Under ``--compile reduce-overhead``, tell CUDA graphs a new call begins: its replay
        may then reuse the previous call's output memory, which the step has finished with."""
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()

    @property
    def compiled(self) -> bool:
        """Whether the step runs compiled (``Compilation.compiled``)."""
        return self.compilation.compiled

    @torch.no_grad()
    def evaluate(self, split: str) -> torch.Tensor:
        """(Ka, 2) [loss, accuracy] of the active members on the shared fixed ``split``."""
        self.model.eval()
        Ka = len(self.active)

        def forward(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
            x, lengths, y = model_inputs(batch, self.dtype)  # one batch for every member
            x = x.expand(Ka, *x.shape)
            lengths = None if lengths is None else lengths.expand(Ka, -1)
            self._new_graph_step()
            return self.forward(x, lengths, self.index), y.expand(Ka, *y.shape)

        batches = self.task.eval_batches(split, self.train_config.eval_batch_size)
        return evaluation_sums(batches, forward, Ka, self.device)

    # ----------------------------------------------------------------- checkpoints

    def save(self, directory: str) -> None:
        """Trained tensors, optimiser state and divergence (the frozen body is rebuilt from
        the config)."""
        payload = {
            "params": {n: p.detach().cpu() for n, p in self.model.named_parameters()},
            "optimizer": self.optimizer.state_dict(),
            "metrics": self.metrics.state_dict(),
        }
        torch.save(payload, os.path.join(directory, CHECKPOINT_FILE))

    def member_weights(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s trained tensors, named as in its FPT module (CPU)."""
        return self.model.member_state(member)

    def restore(self, directory: str) -> None:
        payload = load_checkpoint_file(os.path.join(directory, CHECKPOINT_FILE))
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(payload["params"][n])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.metrics.load_state_dict(payload["metrics"])

    def close(self) -> None:
        """Free the cohort's memory (a reused Ray actor runs the next trial here)."""
        flush_denormals(False)
        del self.model, self.forward, self.optimizer
        if self.compilation.mode != "off":
            # Compiled graphs, their guards and CUDA-graph pools hold this cohort's model and
            # memory; the next trial of a reused actor compiles its own.
            torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


__all__ = ["CohortStep"]
