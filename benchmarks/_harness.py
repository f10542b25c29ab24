"""What every benchmark shares: the machine, its matmul peak, synthetic task data, peak
memory, timing, FLOP counts (``scale_fpt.scaling`` via ``profile.step_flops``) and tables.

Benchmarks never need the real datasets: a ``SyntheticTask`` has the task's exact shapes
(``scale_fpt.tasks.task_spec``) filled with random tensors, generated once on the device.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

# OpenMP threads that spin while waiting lose their time slices to any other work on the
# machine (a shared 2-core box ran 5-60x slower with 2 spinning threads); passive waiting
# costs little on a dedicated machine. Set OMP_WAIT_POLICY=ACTIVE to override. This must
# happen before torch loads its OpenMP runtime, so import this module first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from scale_fpt.config import TaskConfig, TrialConfig
from scale_fpt.tasks import task_spec
from scale_fpt.tasks.base import Batch, Task, TaskSpec

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PRECISION = "bf16" if CUDA else "fp32"
"""Training precision of benchmarked trials: bf16 on a GPU, fp32 on a CPU."""


# --------------------------------------------------------------------------- machine


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line naming the hardware and the stack a figure was measured on."""
    parts = [
        f"{cpu_name()}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}"
    ]
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        parts.append(f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB)")
    try:
        import psutil

        parts.append(f"RAM {psutil.virtual_memory().total / 2**30:.0f} GiB")
        load = os.getloadavg()[0]
        parts.append(f"load avg {load:.1f}")
    except (ImportError, OSError):
        pass
    parts.append(f"torch {torch.__version__}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    return "; ".join(parts)


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def header() -> None:
    """What every benchmark prints first: the command, the date and the machine."""
    import datetime
    import shlex
    import sys

    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes")
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"date: {now}")
    print(f"machine: {machine()}")


def matmul_rounds(seconds: float = 2.0, n: int | None = None) -> tuple[list[float], str]:
    """The machine's own matrix-multiply rate (FLOP/s), measured now: the rate of each of
    several timed rounds of square matmuls (fp32 on CPU, bf16 on GPU), in the same process
    and thread setting as the model steps it is compared with. Callers take the median."""
    dtype = torch.bfloat16 if CUDA else torch.float32
    n = n or (8192 if CUDA else 2048)
    a = torch.randn(n, n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, n, device=DEVICE, dtype=dtype)
    out = torch.empty(n, n, device=DEVICE, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    sync()
    flops = 2 * n**3
    rates: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(rates) < 3:
        reps = 10 if CUDA else 2
        start = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        sync()
        rates.append(reps * flops / (time.perf_counter() - start))
    dtype_name = str(dtype).removeprefix("torch.")
    return rates, f"torch.matmul {n}x{n} {dtype_name} on {DEVICE}, median of rounds"


class Peaks:
    """The denominators of MFU for this machine: on a GPU the published dense peak of the
    device and precision (``gpus.CHIPS``), on a CPU (or a GPU not in the table)
    the measured matmul rate. The measured rate is printed beside either way."""

    def __init__(self, measured: float, how: str):
        from scale_fpt import gpus

        self.measured, self.how = measured, how
        found = gpus.device_peak(torch.cuda.get_device_name(), PRECISION) if CUDA else None
        self.published = found[1] if found else None
        self.kind = (
            f"published dense {PRECISION} peak of the {found[0].name} ({found[0].source})"
            if found
            else f"measured matmul rate ({how})"
        )

    @property
    def mfu_peak(self) -> float:
        return self.published or self.measured

    def denominator(self) -> str:
        if self.published:
            return f"{si(self.published, 'FLOP/s')}, the {self.kind}"
        return "the measured matmul rate (a CPU has no published peak)"

    def describe(self) -> str:
        measured = f"measured matmul {si(self.measured, 'FLOP/s')} ({self.how})"
        if self.published:
            return f"MFU denominator: {si(self.published, 'FLOP/s')}, {self.kind}; {measured}"
        return f"MFU denominator: {measured} (a CPU has no published peak)"


# --------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory of a block: on a GPU ``torch.cuda.max_memory_allocated``; on a CPU the
    peak resident set size (psutil, sampled every ``interval`` s by a thread) minus the RSS
    when the block began. Use as ``with PeakMemory() as mem: ...; mem.peak_bytes``."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        if CUDA:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        import psutil

        release_freed_memory()
        self._process = psutil.Process()
        self._base = self._process.memory_info().rss
        self._max = self._base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._max = max(self._max, self._process.memory_info().rss)
            self._stop.wait(self.interval)

    def __exit__(self, *exc) -> None:
        if CUDA:
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
            return
        self._stop.set()
        self._thread.join()
        self._max = max(self._max, self._process.memory_info().rss)
        self.peak_bytes = self._max - self._base


def release_freed_memory() -> None:
    """Return memory freed by earlier rows to the OS (glibc keeps it otherwise), so that an
    RSS delta measures this row alone."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def memory_kind() -> str:
    return "CUDA max_memory_allocated" if CUDA else "peak RSS (psutil, sampled) minus RSS before"


# --------------------------------------------------------------------------- data


EVAL_SEEDS = {"val": 54321, "test": 12345}
"""Seeds of the synthetic validation and test batches (one per split in EVAL_SPLITS)."""


class SyntheticTask(Task):
    """Random tensors with the shapes of ``task``'s spec, made once on the device.

    Training steps cycle through ``pool`` batches (no host work per step); the validation and
    test sets are ``test_batches`` batches each of the same kind. Values: uniform [0, 1) tokens (continuous
    tasks) or uniform token ids (discrete), uniform labels."""

    def __init__(self, config: TaskConfig, seed: int, pool: int = 8, test_batches: int = 2):
        super().__init__(config, seed)
        self.name = config.task
        self.spec = task_spec(config)
        self.pool_size, self.n_test = pool, test_batches
        self._pools: dict[int, list[Batch]] = {}

    def _make(self, n: int, g: torch.Generator) -> Batch:
        s: TaskSpec = self.spec
        if s.discrete:
            x = torch.randint(0, s.vocab_size, (n, s.n_tokens), generator=g)
        else:
            x = torch.rand(n, s.n_tokens, s.token_width, generator=g)
        y = torch.randint(
            0, s.n_classes, (n, s.n_predicting_tokens, s.outputs_per_token), generator=g
        )
        return Batch(x, y).to(DEVICE)

    def _pool(self, batch_size: int) -> list[Batch]:
        if batch_size not in self._pools:
            g = torch.Generator().manual_seed(self.seed)
            self._pools[batch_size] = [self._make(batch_size, g) for _ in range(self.pool_size)]
        return self._pools[batch_size]

    def train_batch(self, step: int, batch_size: int) -> Batch:
        pool = self._pool(batch_size)
        return pool[step % len(pool)]

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        g = torch.Generator().manual_seed(EVAL_SEEDS[split])
        for _ in range(self.n_test):
            yield self._make(batch_size, g)


def data_note() -> str:
    return (
        "data: synthetic random tensors with each task's exact shapes "
        "(scale_fpt.tasks.task_spec), generated once on the device"
    )


IMAGE_TASKS = ("mnist", "cifar10", "cifar10-lra")
PACKED_COMPILE = "auto"
"""The cohort step's ``--compile`` in the benchmarks: what a sweep runs (``steps.choice``):
CUDA graphs on a GPU; eager on a CPU, where the fused kernels are the fast path and
compilation takes minutes."""


def image_dataset(root: str, n_train: int, n_test: int, seed: int = 0) -> str:
    """A CIFAR-10-shaped dataset of random 32x32 RGB images, written as the hub's Parquet
    (``plain_text/{split}-00000-of-00001.parquet``, PNG-encoded ``img`` and ``label``) in
    ``root``: the real loader decodes it and the real task class serves it."""
    import datasets
    import numpy as np
    from PIL import Image

    datasets.disable_progress_bars()
    rng = np.random.default_rng(seed)
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
    )
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        columns = {"img": [Image.fromarray(a) for a in images], "label": [i % 10 for i in range(n)]}
        dataset = datasets.Dataset.from_dict(columns, features=features)
        dataset.to_parquet(f"{root}/plain_text/{split}-00000-of-00001.parquet")
    return root


QUICK_IMAGES = 200
"""Train images of the generated dataset in a ``--quick`` run."""


def add_data_arguments(parser) -> None:
    """``--data real|synthetic`` and ``--images``: what the benchmarks train on."""
    parser.add_argument(
        "--data",
        choices=("real", "synthetic"),
        default="real",
        help="real: the tasks' own data on the device (default); synthetic: batches made once",
    )
    parser.add_argument(
        "--images",
        type=int,
        default=10_000,
        help=f"train images of the generated dataset (--quick: at most {QUICK_IMAGES})",
    )


def prepare_data(args, tasks: list[str]) -> str | None:
    """With ``--data real``: the image dataset ``tasks`` need, written to a new directory
    (returned); with ``--data synthetic``: None. Prints the data line either way."""
    if args.data == "synthetic":
        print(data_note())
        return None
    images = min(args.images, QUICK_IMAGES) if args.quick else args.images
    image_dir = tempfile.mkdtemp(prefix="scale_fpt_images_")
    if any(t in IMAGE_TASKS for t in tasks):
        image_dataset(image_dir, images, max(images // 5, 1))
    print(
        "data: each task's own (scale_fpt.tasks.build_task), held and drawn on the device; "
        f"image tasks: {images} random CIFAR-10-shaped train images via Parquet, augmented"
    )
    return image_dir


def benchmark_task(name: str, image_dir: str | None) -> Task:
    """The task ``name`` a benchmark trains on: with an ``image_dir`` (``prepare_data``) as a
    trial builds it (``build_task``, seed 0), its data on the device (generated tasks draw
    there; image tasks read ``image_dir``); without, a ``SyntheticTask``."""
    if image_dir is None:
        return SyntheticTask(TaskConfig(task=name), seed=0)
    from scale_fpt.tasks import build_task

    data_dir = image_dir if name in IMAGE_TASKS else ""
    return build_task(TaskConfig(task=name, data_dir=data_dir), seed=0).to(DEVICE)


# --------------------------------------------------------------------------- FLOPs


def trial_config(model: str, task: str, finetune: str, batch_size: int, **extra) -> TrialConfig:
    return TrialConfig.from_flat(
        {
            "task": task,
            "model": model,
            "init": "random",
            "finetune": finetune,
            "batch_size": batch_size,
            "precision": PRECISION,
            "accelerator": DEVICE,
            **extra,
        }
    )


def flops_per_step(config: TrialConfig) -> int:
    """Model FLOPs of one training step of ``config`` (4N + attention frozen, 6N full),
    counted by the trial's profile on the model built on the meta device: the one
    definition both paths are measured by (the packed path runs fewer, as it skips the last
    block for tokens that are not read out; its MFU counts the trial's work all the same)."""
    from scale_fpt.profile import config_profile

    return config_profile(config).flops[0]


# --------------------------------------------------------------------------- timing


def time_steps(
    step: Callable[[int], object],
    steps: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per step: ``warmup`` untimed calls, then the median of ``steps`` timed ones
    (the median resists other processes briefly taking the cores); ``clock``: wall time, or
    ``time.process_time`` for this process's CPU time (user + system)."""
    for i in range(warmup):
        step(i)
    sync()
    times = []
    for i in range(warmup, warmup + steps):
        start = clock()
        step(i)
        sync()
        times.append(clock() - start)
    return statistics.median(times)


# --------------------------------------------------------------------------- output


def si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain fixed-width table (Markdown-compatible), columns in order."""
    text = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(columns)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for t in text:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)) + " |")


def print_target(what: str, value: float, target: float, fmt: str, at_most: bool = False) -> None:
    """One line: a measured figure against its target (at least it, or ``at_most``), e.g.
    ``fmt=".1%"``."""
    met = value <= target if at_most else value >= target
    bound = "<=" if at_most else ">="
    print(f"target: {what} {value:{fmt}} {'meets' if met else 'misses'} {bound} {target:{fmt}}")


def quiet() -> None:
    """Keep library chatter (DeepSpeed, transformers) out of the printed tables."""
    import logging
    import warnings

    os.environ.setdefault("DS_ACCELERATOR", DEVICE)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")
    for name in ("DeepSpeed", "deepspeed", "transformers", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
