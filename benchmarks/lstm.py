"""The LSTM baseline's training step: the layer-normalised LSTM (``models.fpt.LSTMBackbone``,
the reference code's, ``--lstm-layer-norm``, the default) against torch's ``nn.LSTM`` (the
same backbone with ``--no-lstm-layer-norm``) of the same size: the median time of a
forward, backward and Adam step of the backbone, in wall and in this process's CPU seconds
(on a shared machine the CPU time is the steadier: other processes' work is not in it), the
two arms' steps interleaved so that other work slows both alike, and their ratios against
the target (<= 3x).

    python benchmarks/lstm.py                       # the paper's 3 x 768, T = 1024, batch 4
    python benchmarks/lstm.py --seq 64 --steps 3    # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import _harness as harness
import torch

from scale_fpt.models.fpt import LSTMBackbone

TARGET = 3.0
"""The layer-normalised LSTM's step time at most this many times ``nn.LSTM``'s."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=1024, help="tokens T (default 1024)")
    parser.add_argument("--batch", type=int, default=4, help="sequences (default 4)")
    parser.add_argument("--width", type=int, default=768, help="LSTM width (default 768)")
    parser.add_argument("--layers", type=int, default=3, help="LSTM layers (default 3)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per arm (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per arm first")
    args = parser.parse_args()
    if min(args.seq, args.batch, args.width, args.layers, args.steps) < 1 or args.warmup < 0:
        parser.error("--seq, --batch, --width, --layers and --steps must be >= 1, --warmup >= 0")
    return args


def training_step(backbone: LSTMBackbone, inputs: torch.Tensor):
    """One step: forward, a loss on the last tokens (as the tasks read out), backward, Adam."""
    optimizer = torch.optim.Adam(backbone.parameters(), lr=1e-4)

    def step() -> None:
        loss = backbone(inputs)[:, -8:].square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    args = parse_args()
    harness.header()
    torch.manual_seed(0)
    inputs = torch.randn(args.batch, args.seq, args.width, device=harness.DEVICE)
    arms = {
        name: training_step(
            LSTMBackbone(args.width, args.layers, 0.1, layer_norm).to(harness.DEVICE), inputs
        )
        for name, layer_norm in (("nn.LSTM", False), ("layernorm", True))
    }
    wall, cpu = ({name: [] for name in arms} for _ in "wc")
    for i in range(args.warmup + args.steps):
        for name, step in arms.items():
            harness.sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            harness.sync()
            if i >= args.warmup:
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    medians = {name: statistics.median(seconds) for name, seconds in wall.items()}
    cpu_medians = {name: statistics.median(seconds) for name, seconds in cpu.items()}
    print(
        f"{args.layers} layers x {args.width}, T {args.seq}, batch {args.batch}, fp32, "
        f"device {harness.DEVICE}, {args.steps} timed steps per arm (interleaved) after "
        f"{args.warmup} untimed"
    )
    rows = [
        {
            "backbone": name,
            "step (s, median)": f"{medians[name]:.3g}",
            "vs nn.LSTM": f"{medians[name] / medians['nn.LSTM']:.2f}x",
            "CPU s (median)": f"{cpu_medians[name]:.3g}",
            "CPU vs nn.LSTM": f"{cpu_medians[name] / cpu_medians['nn.LSTM']:.2f}x",
            "steps (s)": ", ".join(f"{t:.3g}" for t in wall[name]),
        }
        for name in arms
    ]
    harness.print_table(rows, list(rows[0]))
    for what, times in (("step time", medians), ("CPU time per step", cpu_medians)):
        ratio = times["layernorm"] / times["nn.LSTM"]
        harness.print_target(f"layernorm / nn.LSTM {what}", ratio, TARGET, ".2f", at_most=True)


if __name__ == "__main__":
    main()
