"""Step objects: what one training step, one evaluation and one checkpoint of K >= 1
trials do on a device. ``scale_fpt.loop.fit`` drives them (its docstring states the
protocol); ``cohort.CohortStep`` and ``engine.EngineStep`` implement it.

Shared here: a batch's model inputs, the per-member loss and accuracy of a batch, and the
per-member training metrics and divergence both step kinds keep on the device between
evaluations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scale_fpt.tasks.base import Batch

NEVER = 2**62
"""``MemberMetrics.diverged_at`` of a member whose loss has always been finite."""


def model_inputs(
    batch: Batch, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(x, lengths, y) of ``batch`` (made on the step's device by its task), continuous
    inputs in the compute ``dtype``, token ids as they are."""
    x = batch.x if batch.x.dtype == torch.long else batch.x.to(dtype)
    return x, batch.lengths, batch.y


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per member: mean cross-entropy over all its predictions (every bit, for bit tasks)
    and the number correct. logits (Ka, B, k, m, C), targets (Ka, B, k, m) -> (Ka,), (Ka,);
    scored in float32 whatever the logits' dtype."""
    Ka, C = logits.shape[0], logits.shape[-1]
    flat = logits.float().reshape(Ka, -1, C)
    targets = targets.reshape(Ka, -1)
    ce = F.cross_entropy(flat.reshape(-1, C), targets.reshape(-1), reduction="none")
    correct = (flat.argmax(-1) == targets).sum(1)
    return ce.view(Ka, -1).mean(1), correct


class MemberMetrics:
    """Training metrics and divergence of K members, accumulated on the device.

    ``record`` adds one step's losses without reading them on the host; the loop reads the
    sums (``take``) and ``diverged_at`` at its evaluations only. A member whose loss is not
    finite gets ``diverged_at`` = that step (the steps before it are the ones it completed)
    and adds nothing from then on.
    """

    def __init__(self, size: int, device: torch.device | str):
        self.loss_sum = torch.zeros(size, dtype=torch.float64, device=device)  # (K,)
        self.accuracy_sum = torch.zeros(size, dtype=torch.float64, device=device)  # (K,)
        self.diverged_at = torch.full((size,), NEVER, dtype=torch.int64, device=device)  # (K,)
        self.last_loss = torch.zeros(size, device=device)  # (K,) the latest step's losses

    def record(
        self,
        step: int,
        loss: torch.Tensor,
        correct: torch.Tensor,
        predictions: int,
        index: torch.Tensor | None,
    ) -> torch.Tensor:
        """Add the losses (Ka,) and correct counts (Ka,) of members ``index`` (None: all K)
        at ``step``, ``predictions`` per member; returns (Ka,) bool: which members' updates
        count (finite loss, not diverged before)."""
        diverged = self.diverged_at if index is None else self.diverged_at.index_select(0, index)
        alive = diverged == NEVER
        finite = torch.isfinite(loss.detach()) & alive
        diverged = torch.where(alive & ~finite, step, diverged)
        loss_add = torch.where(finite, loss.detach().double(), 0.0)
        accuracy_add = torch.where(finite, correct.double() / predictions, 0.0)
        if index is None:
            self.diverged_at.copy_(diverged)
            self.loss_sum.add_(loss_add)
            self.accuracy_sum.add_(accuracy_add)
            self.last_loss.copy_(loss.detach())  # in place: a compiled step's output memory
        else:  # is the graph's own (CUDA graphs overwrite it at the next step)
            self.diverged_at.index_copy_(0, index, diverged)
            self.loss_sum.index_add_(0, index, loss_add)
            self.accuracy_sum.index_add_(0, index, accuracy_add)
            self.last_loss.zero_().index_copy_(0, index, loss.detach())
        return finite

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors ``record`` updates in place."""
        return [self.loss_sum, self.accuracy_sum, self.diverged_at, self.last_loss]

    def take(self) -> torch.Tensor:
        """(K, 2) sums of [loss, accuracy] since the last call (on the device); resets them."""
        sums = torch.stack([self.loss_sum, self.accuracy_sum], 1)
        self.loss_sum.zero_()
        self.accuracy_sum.zero_()
        return sums

    def state_dict(self) -> dict:
        return {"diverged_at": self.diverged_at.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.diverged_at.copy_(state["diverged_at"])


@torch.no_grad()
def evaluation_sums(batches, forward, size: int, device, total=None) -> torch.Tensor:
    """(size, 2) [mean loss, accuracy] over every prediction of the evaluation ``batches``;
    ``forward(batch) -> (logits (size, ...), targets (size, ...))``, or None for a batch
    this process counts nothing of. ``total``: sums a tensor over the processes that share
    the evaluation (a data-parallel world); None: this process alone. Stays on the device."""
    sums = torch.zeros(size, 3, dtype=torch.float64, device=device)  # [loss, correct, count]
    for batch in batches:
        out = forward(batch)
        if out is None:
            continue
        logits, targets = out
        loss, n_correct = member_losses(logits, targets)
        n = targets[0].numel()
        sums[:, 0] += loss.double() * n
        sums[:, 1] += n_correct
        sums[:, 2] += n
    if total is not None:
        sums = total(sums)
    return sums[:, :2] / sums[:, 2:].clamp(min=1)


__all__ = ["NEVER", "MemberMetrics", "evaluation_sums", "member_losses"]
