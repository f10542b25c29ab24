"""Causal attention with keyed dropout: the Triton kernel (``models/flash_attention.py``) vs
the materialised attention (``ops.materialised_attention``, the (N, H, T, T) probabilities
in torch ops) and torch's fused SDPA with its own, unkeyed dropout (the speed a fused kernel
reaches, without the masks a packed member needs): the median time of a forward and
backward pass, peak memory above the inputs, and the largest difference from the
materialised outputs (fp32 reference).

    python benchmarks/attention.py              # GPU: T = 1024, 8 x 12 heads x 64, bf16
    python benchmarks/attention.py --interpret  # CPU: tiny shapes in Triton's interpreter
                                                # (proves the plumbing; times mean nothing)
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=1024, help="tokens T (default 1024)")
    parser.add_argument("--batch", type=int, default=8, help="sequences N (default 8)")
    parser.add_argument("--heads", type=int, default=12, help="heads H (default 12, gpt2)")
    parser.add_argument("--head-dim", type=int, default=64, help="head size (default 64)")
    parser.add_argument("--dropout", type=float, default=0.1, help="on the probabilities")
    parser.add_argument("--members", type=int, default=2, help="dropout keys (packed members)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                        help="default: bf16 on a GPU, fp32 on a CPU")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="timed passes (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed passes first")
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="run the kernel in Triton's interpreter on the CPU at tiny shapes "
        "(T 32, 2 x 2 heads x 16, blocks of 16, 1 timed pass)",
    )
    args = parser.parse_args()
    if args.interpret:  # Triton reads it when imported: before anything imports it
        os.environ["TRITON_INTERPRET"] = "1"
        args.seq, args.batch, args.heads, args.head_dim = 32, 2, 2, 16
        args.steps, args.warmup = 1, 0
    problems = []
    if not 0.0 <= args.dropout < 1.0:
        problems.append(f"--dropout {args.dropout} is not in [0, 1)")
    if min(args.seq, args.batch, args.heads, args.head_dim, args.members, args.steps) < 1:
        problems.append("--seq, --batch, --heads, --head-dim, --members and --steps must be >= 1")
    elif args.batch % args.members:
        problems.append(f"--batch {args.batch} does not split into {args.members} members")
    sys.path.insert(0, os.path.dirname(__file__))
    import _harness as harness  # first torch import, after TRITON_INTERPRET (see _harness)

    if not args.interpret and not harness.CUDA:
        problems.append("no CUDA GPU here: pass --interpret for the CPU plumbing run")
    if problems:
        parser.error("; ".join(problems))
    return args


def main() -> None:
    args = parse_args()
    import _harness as harness
    import torch

    from scale_fpt.models import ops
    from scale_fpt.models.flash_attention import BLOCK, flash_attention

    device = "cpu" if args.interpret else harness.DEVICE
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[
        args.dtype or ("fp32" if device == "cpu" else "bf16")
    ]
    block = 16 if args.interpret else BLOCK
    harness.header()
    N, H, T, hd, p = args.batch, args.heads, args.seq, args.head_dim, args.dropout
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(N, H, T, hd, generator=generator).to(device, dtype) for _ in "qkv"]
    weights = torch.randn(N, H, T, hd, generator=generator).to(device, dtype)
    step_keys = ops.step_keys(list(range(args.members)), 0).to(device)
    scale = hd**-0.5

    arms = {
        "triton (keyed)": lambda q, k, v: flash_attention(
            q, k, v, scale, None, step_keys, p, block
        ),
        "materialised (keyed)": lambda q, k, v: ops.materialised_attention(
            q, k, v, scale, p, None, ops.DropoutSites(step_keys)
        ),
        "sdpa (unkeyed)": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=p, is_causal=True, scale=scale
        ),
    }
    exact = [t.float() for t in inputs]
    reference = ops.materialised_attention(*exact, scale, p, None, ops.DropoutSites(step_keys))

    def run(arm):
        def step(_):
            leaves = [t.detach().requires_grad_() for t in inputs]
            out = arm(*leaves)
            torch.autograd.grad((out * weights).sum(), leaves)
            return out

        return step

    rows = []
    for name, arm in arms.items():
        seconds = harness.time_steps(run(arm), args.steps, args.warmup)
        with harness.PeakMemory() as memory:
            out = run(arm)(0)
        difference = (out.float() - reference).abs().max().item()
        rows.append(
            {
                "path": name,
                "fwd+bwd (ms, median)": f"{seconds * 1e3:.3g}",
                "peak memory": harness.si(memory.peak_bytes, "B"),
                "max abs diff from materialised fp32": "- (other masks)"
                if "unkeyed" in name
                else f"{difference:.2g}",
            }
        )
    materialised = float(rows[1]["fwd+bwd (ms, median)"])
    for row in rows:
        row["vs materialised"] = f"{materialised / float(row['fwd+bwd (ms, median)']):.3g}x"
    print(
        f"N {N}, H {H}, T {T}, head size {hd}, {str(dtype).removeprefix('torch.')}, "
        f"dropout {p}, {args.members} member keys, device {device}"
        + (" (Triton interpreter: plumbing only, times mean nothing)" if args.interpret else "")
    )
    columns = ["path", "fwd+bwd (ms, median)", "vs materialised", "peak memory"]
    harness.print_table(rows, [*columns, "max abs diff from materialised fp32"])


if __name__ == "__main__":
    main()
