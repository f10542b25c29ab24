"""The GPUs this project knows: one table of each GPU's name, memory and published dense
peaks per precision (``GPUS``), for the planner (``--gpu``, GPU-hours) and for MFU (the
benchmarks divide by ``device_peak`` of the device CUDA names)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from scale_fpt.config import ConfigError

MIB = 2**20


@dataclass(frozen=True)
class Chip:
    """A GPU chip's published dense peak (no 2:4 structured sparsity), FLOP/s per
    precision: the denominator of MFU. Vendors print the sparse figure first; these are
    half of it."""

    name: str
    pattern: str
    """Regular expression matched against ``torch.cuda.get_device_name()``."""
    fp32: float
    """Non-tensor FP32 (torch's default for fp32 matmuls, TF32 off)."""
    tf32: float
    bf16: float
    fp16: float
    source: str


H100_PCIE = Chip(
    "H100 PCIe", r"H100.*PCIe", 51e12, 378e12, 756e12, 756e12,
    "NVIDIA H100 datasheet (PCIe column; 756/1513 TFLOPS bf16 dense/sparse)",
)  # fmt: skip
H100_SXM = Chip(
    "H100 SXM", r"H100(?!.*PCIe)", 67e12, 494.7e12, 989.4e12, 989.4e12,
    "NVIDIA H100 datasheet (SXM column; 989/1979 TFLOPS bf16 dense/sparse)",
)  # fmt: skip
H200_SXM = Chip(
    "H200 SXM", r"H200", 67e12, 494.7e12, 989.4e12, 989.4e12,
    "NVIDIA H200 datasheet (SXM column; same tensor cores as H100 SXM)",
)  # fmt: skip
A100 = Chip(
    "A100 40GB/80GB", r"A100", 19.5e12, 156e12, 312e12, 312e12,
    "NVIDIA A100 datasheet (40 and 80 GB, SXM and PCIe alike)",
)  # fmt: skip
A10G = Chip(
    "A10G", r"A10G?\b", 31.2e12, 62.5e12, 125e12, 125e12,
    "NVIDIA A10 datasheet, 125/250 TFLOPS bf16 dense/sparse (NVIDIA publishes no A10G "
    "sheet; the A10's figures are the ones in use for AWS's A10G)",
)  # fmt: skip
L4 = Chip(
    "L4", r"\bL4\b", 30.3e12, 60e12, 121e12, 121e12,
    "NVIDIA L4 datasheet (242.5 TFLOPS bf16 and 120 tf32 with sparsity: half dense)",
)  # fmt: skip
CHIPS = (H100_PCIE, H100_SXM, H200_SXM, A100, A10G, L4)
"""Published dense peaks of the chips a study is likely to run on (each pattern names one
chip, so their order does not matter)."""


@dataclass(frozen=True)
class GPU:
    """A GPU model the planner knows."""

    name: str
    """What ``--gpu`` and the cluster's node type names call it."""
    memory_mib: int
    """Device memory as CUDA reports it (``nvidia-smi``'s total)."""
    model: str
    """The device name ``torch.cuda.get_device_name`` gives (Ray's accelerator type is
    its short form)."""
    chip: Chip | None
    """Its published peaks (None: a GPU named only by its memory, ``--gpu-memory``)."""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def bf16_flops(self) -> float:
        """Published dense bf16 peak in FLOP/s, for GPU-hour estimates; 0.0 when unknown."""
        return self.chip.bf16 if self.chip else 0.0


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("h200-141gb", 143771, "NVIDIA H200", H200_SXM),
        GPU("h100-80gb", 81559, "NVIDIA H100 80GB HBM3", H100_SXM),
        GPU("a100-80gb", 81920, "NVIDIA A100-SXM4-80GB", A100),
        GPU("a100-40gb", 40960, "NVIDIA A100-SXM4-40GB", A100),
        GPU("a10g-24gb", 23028, "NVIDIA A10G", A10G),
        GPU("l4-24gb", 23034, "NVIDIA L4", L4),
    )
}
DEFAULT_GPU = "a10g-24gb"
"""The GPU of cluster/gpu.yaml's worker types (what ``auto`` plans for when nothing says)."""


def gpu_named(name: str) -> GPU:
    if name not in GPUS:
        raise ConfigError([f"--gpu: unknown GPU {name!r}; choose from {', '.join(GPUS)}"])
    return GPUS[name]


def gpu_with_memory(memory_gb: float, name: str = "") -> GPU:
    """A GPU of ``memory_gb`` GiB (``--gpu-memory``), named after the table's GPU if given."""
    base = GPUS.get(name)
    label = base.name if base else f"{memory_gb:g}gb"
    return GPU(label, int(memory_gb * 1024), base.model if base else "", base and base.chip)


def gpu_in_name(text: str) -> GPU | None:
    """The known GPU whose name appears in ``text`` (a node type such as ``a10g-24gb-x4``)."""
    lowered = text.lower().replace("_", "-")
    return next((g for g in GPUS.values() if g.name in lowered), None)


def device_peak(device_name: str, precision: str) -> tuple[Chip, float] | None:
    """The published dense peak of ``device_name`` (a CUDA device name) for matmuls in
    ``precision`` (fp32, tf32, bf16, fp16); None for a chip not in ``CHIPS`` (and for CPUs,
    whose peak is measured: there is no published figure for a cloud vCPU)."""
    for chip in CHIPS:
        if re.search(chip.pattern, device_name):
            return chip, getattr(chip, precision)
    return None
