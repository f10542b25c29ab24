"""How an attention's queries, keys and values arrive: apart, or stacked as their
projection wrote them. A module of its own because both attention paths read it: ``ops``
(the materialised attention) and ``flash_attention`` (the Triton kernels, which ``ops``
imports only when a GPU path runs), with no import circle between them."""

from __future__ import annotations

import torch


def unstack_heads(
    q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The queries, keys and values of an attention's arguments (views): ``q``, ``k``, ``v``,
    or ``q`` holding all three stacked (3, N, H, T, hd) with ``k`` and ``v`` None, or ``k``
    holding the keys and values stacked (2, N, H, T, hd) with ``v`` None: a projection's
    output, whose gradient the Triton kernel then writes as one tensor (no copy to stack
    three)."""
    if k is None:
        return q.unbind(0)
    if v is None:
        return (q, *k.unbind(0))
    return q, k, v
