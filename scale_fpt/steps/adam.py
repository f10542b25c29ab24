"""Adam over the stacked trained tensors of a packed cohort, one optimiser per member."""

from __future__ import annotations

import torch
from torch import nn


class PackedAdam:
    """K independent Adams (torch's update rule, no weight decay) over stacked tensors.

    Per member: learning rate, gradient-norm clipping over the member's own trained slice
    (DeepSpeed's rule: scale by min(1, clip / (norm + 1e-6))), trained groups (a group the
    member does not train gets zero gradient: Adam then moves it by exactly 0), and a mask
    of members that step (diverged members are frozen; their NaNs never leak).

    The trained tensors live in one (K, P) master tensor (each parameter's data becomes a
    view of its columns), so an update is a dozen operations on that tensor however many
    parameters the model has: a small cohort's step is otherwise dominated by per-tensor
    operation overhead.
    """

    def __init__(
        self,
        params: dict[str, nn.Parameter],
        trains: dict[str, torch.Tensor],
        lr: list[float],
        clip: list[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.names = [n for n, p in params.items() if p.requires_grad]
        self.params = [params[n] for n in self.names]
        K = len(lr)
        self.flat = torch.cat([p.detach().reshape(K, -1) for p in self.params], 1)  # (K, P)
        offset = 0
        for p in self.params:
            width = p[0].numel()
            p.data = self.flat[:, offset : offset + width].view(p.shape)
            offset += width
        # trains[name]: (K,) bool -> (K, P): which member trains which column
        self.trains = torch.cat(
            [
                trains[n].view(K, 1).expand(K, p[0].numel())
                for n, p in zip(self.names, self.params, strict=True)
            ],
            1,
        )
        device = self.flat.device
        self.lr = torch.tensor(lr, dtype=torch.float32, device=device)
        self.clip = torch.tensor(clip, dtype=torch.float32, device=device)
        self.betas, self.eps = betas, eps
        # Steps taken, on the device (float64, exact to 2^53): the bias corrections are then
        # device values, and a compiled update is one graph for every step, not one per step.
        self.step_count = torch.zeros((), dtype=torch.float64, device=device)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors every step updates in place (masters and moments)."""
        return [self.flat, self.exp_avg, self.exp_avg_sq, self.step_count]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], stepping: torch.Tensor) -> None:
        """Update the members where ``stepping`` (K,) bool is set, with the gradients of
        ``self.params`` (in order)."""
        K = self.flat.shape[0]
        g = torch.cat([grad.reshape(K, -1) for grad in grads], 1).float()
        mask = self.trains & stepping[:, None]
        g = torch.where(mask, g, 0.0)  # not a product: a diverged member's NaNs stay out
        norm = torch.linalg.vector_norm(g, dim=1)  # (K,): each member's own gradient norm
        coef = torch.where(self.clip > 0, (self.clip / (norm + 1e-6)).clamp(max=1.0), 1.0)
        g.mul_(coef[:, None])
        self.step_count.add_(1)
        beta1, beta2 = self.betas
        # float64 as Python's floats were: then rounded to float32 where they meet the moments
        bias1 = 1 - torch.pow(beta1, self.step_count)
        bias2_sqrt = (1 - torch.pow(beta2, self.step_count)).sqrt()
        self.exp_avg.lerp_(g, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        update = (self.exp_avg / denom).mul_((self.lr / bias1)[:, None])
        self.flat.sub_(torch.where(mask, update, 0.0))

    def state_dict(self) -> dict:
        return {
            "step_count": int(self.step_count),  # read at checkpoints only
            "exp_avg": self.exp_avg.cpu(),
            "exp_avg_sq": self.exp_avg_sq.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count.fill_(state["step_count"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
