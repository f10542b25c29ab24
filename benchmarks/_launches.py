"""Kernel launches and device syncs of a training step as a CUDA run dispatches them,
counted on a CPU: at small batch a GPU step is bound by how many kernels it launches and how
often the host waits for the device, and those counts do not depend on the machine.

``gpu_path()`` makes the CPU take the code path a GPU takes:

- ``ops.on_gpu`` answers True: torch's GELU and dropout kernels, the Triton attention and
  dropout kernels (run by Triton's interpreter, ``TRITON_INTERPRET=1``, set here before
  Triton is imported), never the CPU's fused C++ kernels (``models/csrc``);
- ``tasks.base.draws_on_gpu`` answers True: training batches are drawn by compiled code, and
  host data is copied from pinned memory (``pin_memory``, counted as the one copy);
- torch's foreach kernels are allowed on CPU tensors (``clip_grad_norm_(foreach=True)``,
  foreach optimizers), as on CUDA tensors;
- ``torch.compile`` compiles through AOTAutograd with the graphs' own ops left uncounted
  (inductor would fuse them; on a CPU it would emit C++ kernels, not the GPU's): what is
  counted is what runs eagerly around the graphs. Graphs compiled, graphs run
  (``graph_calls``, each at least one kernel), graph breaks and the aten ops inside the
  graphs before fusion are recorded beside.

``LaunchCounter`` (a ``TorchDispatchMode`` plus a few hooks) then counts, per step:

- kernel ops: every aten op that launches a kernel on a GPU (views and metadata-only ops,
  allocations and host reads do not), and one per Triton launch. A custom op of this
  project (``scale_fpt::*``: the Triton kernels' wrappers) is entered, so its own torch ops
  and its launches count, and the Triton kernels run under the interpreter uncounted;
- device syncs: explicit synchronisations (``torch.cuda.synchronize``, DeepSpeed's
  accelerator), host reads of device values (``.item()``, ``bool()``, ``tolist()``,
  ``.cpu()``, ``.numpy()``, ``nonzero``, boolean indexing) and blocking host-to-device
  copies (a tensor made from host data, ``torch.tensor(...)``: a copy from pageable memory,
  which waits for the stream);
- non-matmul bytes: the bytes each non-matmul kernel reads and writes (its tensor
  arguments and results; a Triton launch's tensor arguments).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator, Mapping

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when Triton is imported

import torch
import torch.optim.optimizer as optimizer_module
import torch.utils._foreach_utils as foreach_utils
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.decomposition import select_decomp_table
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from scale_fpt.models import ops
from scale_fpt.tasks import base as task_base

aten = torch.ops.aten

NO_KERNEL = {
    aten.detach,
    aten.alias,
    aten.lift_fresh,
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten._local_scalar_dense,
    aten._unsafe_view,
    aten._reshape_alias,
    aten.resize_,
    aten.set_,
    aten.is_same_size,
    aten._has_compatible_shallow_copy_type,
    aten.record_stream,
}
"""Ops that launch no kernel on a GPU (allocations, aliasing, metadata, host reads; views
are recognised by their schema)."""

HOST_READS = {
    aten._local_scalar_dense: ".item() / bool()",
    aten.nonzero: "nonzero",
    aten.masked_select: "masked_select",
    aten.equal: "equal",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.unique_consecutive: "unique",
}
"""Ops whose result the host must wait for on a GPU (a value or a data-dependent shape)."""

MATMULS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.addbmm, aten.convolution}


def _tensor_bytes(values) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor)
    )


class LaunchCounter(TorchDispatchMode):
    """Counts kernel ops, device syncs and non-matmul bytes while active (see the module
    docstring); ``paused()`` stops counting inside (e.g. a Triton kernel's interpreter).

    ``regions``: attribute each kernel op to the innermost calling function named in it,
    ``{(file name, function name): region}`` (``regions`` counts them; ``"other"`` where no
    caller is named). Reading the Python stack per op is slow: for breakdowns only."""

    def __init__(self, regions: Mapping[tuple[str, str], str] | None = None):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.regions: Counter[str] = Counter()
        self.nonmatmul_bytes = 0
        self.graph_calls = 0
        self.launch_sites: Counter[str] = Counter()
        """Kernel launch sites inside the compiled graphs that ran, by kind (``launch_sites``)."""
        self._paused = 0
        self._counting = 0
        self._region_of = regions

    def __enter__(self):
        self._counting += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._counting -= 1
        return super().__exit__(*exc)

    def graph_called(self, sites: Counter[str]) -> None:
        """A compiled graph ran (its ops uncounted: inductor fuses them into its kernels),
        with inductor's kernel launch ``sites`` inside it by kind."""
        if self._counting and not self._paused:
            self.graph_calls += 1
            self.launch_sites.update(sites)

    def host_to_device(self) -> None:
        """A copy of host data to the device from pinned memory: one copy, no wait."""
        if self._counting and not self._paused:
            self._count("copy from pinned memory")

    @property
    def kernel_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def device_syncs(self) -> int:
        return sum(self.syncs.values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def sync(self, why: str) -> None:
        if not self._paused:
            self.syncs[why] += 1

    def launch(self, name: str, args) -> None:
        """One Triton kernel launch with tensor arguments ``args``."""
        if not self._paused:
            self._count(f"triton.{name}")
            self.nonmatmul_bytes += _tensor_bytes(args)

    def _count(self, op: str) -> None:
        self.ops[op] += 1
        if self._region_of is not None:
            self.regions[self._caller_region()] += 1

    def _caller_region(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            file = os.path.basename(code.co_filename)
            region = self._region_of.get((file, code.co_name)) or self._region_of.get((file, "*"))
            if region is not None:
                return region
            frame = frame.f_back
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        if func.namespace == "scale_fpt":  # a Triton kernel's wrapper: count what it does
            with self:
                return OPDEFS[func._schema.name]._init_fn(*args, **kwargs)
        packet = func.overloadpacket
        if packet is aten.lift_fresh:
            self.syncs["host-to-device copy"] += 1
        elif packet in HOST_READS:
            self.syncs[HOST_READS[packet]] += 1
        elif packet is aten.index and any(t is not None and t.dtype == torch.bool for t in args[1]):
            self.syncs["boolean index"] += 1
        out = func(*args, **kwargs)
        if packet in NO_KERNEL or func.is_view:
            return out
        self._count(str(packet).removeprefix("aten."))
        if packet not in MATMULS:
            self.nonmatmul_bytes += _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        return out


LAUNCH_SITE = re.compile(
    r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|aten\.\w+|"
    r"torch\.ops\.\w+\.\w+)(?:\.default)?\(",
    re.MULTILINE,
)
"""A kernel call in the ``call`` function of inductor's generated code: a generated kernel
(``cpp_fused_*`` on a CPU, ``triton_*.run`` on a GPU), a library kernel
(``extern_kernels.mm`` ...) or an op inductor falls back to (``aten.*``, ``torch.ops.*``:
this project's custom ops among them)."""


def launch_sites(code: str) -> Counter[str]:
    """Kernel calls in the ``call`` function of inductor's output ``code``, by callee kind:
    ``generated``, ``library`` or ``fallback``."""
    lines, body, indent = code.splitlines(), [], None
    for line in lines:  # ``call``: a function, or a method of the module's runner
        stripped = line.lstrip()
        if indent is None:
            if stripped.startswith("def call("):
                indent = len(line) - len(stripped)
        elif stripped and len(line) - len(stripped) <= indent:
            break
        else:
            body.append(line)
    kinds: Counter[str] = Counter()
    for callee in LAUNCH_SITE.findall("\n".join(body)):
        if callee.startswith(("cpp_fused_", "triton_")):
            kinds["generated"] += 1
        elif callee.startswith("extern_kernels."):
            kinds["library"] += 1
        else:
            kinds["fallback"] += 1
    return kinds


def inductor_launch_sites(gm: torch.fx.GraphModule, example_inputs) -> Counter[str] | None:
    """``launch_sites`` of the code inductor generates for the aten graph ``gm`` on its
    inputs' device (a CPU here: the CPU proxy of the GPU's kernels; inductor cannot emit
    CUDA code without a CUDA build of torch). None where inductor fails on the graph."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    saved = GraphLowering.save_output_code
    GraphLowering.save_output_code = codes.append
    try:
        with inductor_config.patch(fx_graph_cache=False), _disable_current_modes():
            compile_fx_inner(copy.deepcopy(gm), example_inputs)
    except Exception:  # inductor's CPU backend fails on some graphs (docs/performance.md)
        if os.environ.get("STEP_OPS_DEBUG"):
            raise
        return None
    finally:
        GraphLowering.save_output_code = saved
    return launch_sites(codes[-1]) if codes else None


class CompiledGraphs:
    """What ``torch.compile`` made while counting: graphs compiled (forward and backward,
    each), the aten ops inside them before fusion, dynamo's graph breaks and, with
    ``sites``, the kernel launch sites inductor generates for each graph (its CPU code: a
    named proxy), counted per graph call (``LaunchCounter.launch_sites``)."""

    def __init__(self, counter: LaunchCounter, sites: bool = False):
        self.counter = counter
        self.compiled = 0
        self.ops_inside = 0
        self.sites = sites
        self.uncounted_graphs = 0
        """Graphs inductor's CPU backend failed on: their launch sites are not counted."""
        # Inductor lowers graphs decomposed by its own table (as torch.compile gives it them).
        decompositions = select_decomp_table() if sites else None
        self.backend = aot_autograd(
            fw_compiler=self._compiler, bw_compiler=self._compiler, decompositions=decompositions
        )

    def _compiler(self, gm: torch.fx.GraphModule, example_inputs):
        self.compiled += 1
        self.ops_inside += sum(
            1
            for node in gm.graph.nodes
            if node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload)
            and node.target.overloadpacket not in NO_KERNEL
            and not node.target.is_view
        )
        sites = inductor_launch_sites(gm, example_inputs) if self.sites else Counter()
        if sites is None:
            self.uncounted_graphs += 1

        def run(*args):
            self.counter.graph_called(sites or Counter())
            with _disable_current_modes(), self.counter.paused():  # Triton launches too
                return gm(*args)

        return make_boxed_func(run)

    def compile(self, model, mode=None, **kwargs):
        """``torch.compile``'s stand-in: the module compiled with the counting backend, called
        with no dispatch mode active (dynamo runs a frame eagerly under one)."""
        compiled = torch._dynamo.optimize(self.backend)(model)

        def call(*args, **kwargs):
            with _disable_current_modes():
                return compiled(*args, **kwargs)

        return call

    @staticmethod
    def graph_breaks() -> int:
        return sum(torch._dynamo.utils.counters["graph_break"].values())


class _FusedAttention(torch.autograd.Function):
    """``F.scaled_dot_product_attention`` counted as CUDA runs it: one fused kernel forward
    and one backward (flash or memory-efficient attention, dropout drawn inside), computed
    here by torch's CPU kernels with counting paused."""

    @staticmethod
    def forward(ctx, counter, sdpa, kwargs, q, k, v):
        counter._count("fused_attention")
        ctx.counter, ctx.sdpa, ctx.kwargs = counter, sdpa, kwargs
        ctx.save_for_backward(q, k, v)
        with counter.paused(), torch.random.fork_rng():
            ctx.rng = torch.get_rng_state()  # the backward redraws the same mask
            return sdpa(q, k, v, **kwargs)

    @staticmethod
    def backward(ctx, grad):
        ctx.counter._count("fused_attention_backward")
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with ctx.counter.paused(), torch.random.fork_rng(), torch.enable_grad():
            torch.set_rng_state(ctx.rng)
            out = ctx.sdpa(q, k, v, **ctx.kwargs)
            grads = torch.autograd.grad(out, (q, k, v), grad)
        return (None, None, None, *grads)


@contextlib.contextmanager
def cuda_kernels(counter: LaunchCounter) -> Iterator[None]:
    """torch's own dropout and attention dispatched as on CUDA: ``F.dropout`` is one
    ``native_dropout`` (its CPU form is three ops: bernoulli, div, mul) and
    ``F.scaled_dot_product_attention`` one fused kernel each way (``_FusedAttention``; the
    CPU's math attention with dropout is ~10 ops). For the plain baseline, so that it is
    counted along the path a GPU takes, as the steps are."""
    functional = torch.nn.functional
    sdpa, dropout = functional.scaled_dot_product_attention, functional.dropout

    def fused_dropout(x, p=0.5, training=True, inplace=False):
        return torch.native_dropout(x, p, training)[0] if training and p > 0 else x

    def fused_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        kwargs.update(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
        return _FusedAttention.apply(counter, sdpa, kwargs, q, k, v)

    functional.dropout, functional.scaled_dot_product_attention = fused_dropout, fused_attention
    try:
        yield
    finally:
        functional.dropout, functional.scaled_dot_product_attention = dropout, sdpa


def _counting_method(counter: LaunchCounter, method, why: str):
    def counted(self, *args, **kwargs):
        counter.sync(why)
        return method(self, *args, **kwargs)

    return counted


@contextlib.contextmanager
def gpu_path(counter: LaunchCounter, sites: bool = False) -> Iterator[CompiledGraphs]:
    """The CPU takes the GPU's code path (module docstring) and ``counter`` hears of the
    syncs and Triton launches that dispatch does not show, until the context exits;
    ``sites``: also count inductor's launch sites inside the compiled graphs."""
    from triton.runtime.interpreter import InterpretedFunction

    graphs = CompiledGraphs(counter, sites)
    run_kernel = InterpretedFunction.run

    def launch(self, *args, grid, warmup, **kwargs):
        counter.launch(self.fn.__name__, (args, kwargs))
        with counter.paused():
            return run_kernel(self, *args, grid=grid, warmup=warmup, **kwargs)

    def devices():
        return [*foreach_devices(), "cpu"]

    def pin_memory(tensor, device=None):  # a CPU has no pinned memory: the copy is counted
        counter.host_to_device()
        return tensor

    def from_numpy(array):  # a host tensor, whatever the device (dispatch says lift_fresh)
        with counter.paused():
            return host_tensor(array)

    host_tensor = torch.from_numpy

    foreach_devices = foreach_utils._get_foreach_kernels_supported_devices
    patches = [
        (ops, "on_gpu", lambda x: True),
        (task_base, "draws_on_gpu", lambda device: True),
        (torch.Tensor, "pin_memory", pin_memory),
        (torch, "from_numpy", from_numpy),
        (InterpretedFunction, "run", launch),
        (foreach_utils, "_get_foreach_kernels_supported_devices", devices),
        (optimizer_module, "_get_foreach_kernels_supported_devices", devices),
        (torch, "compile", graphs.compile),
        (torch.cuda, "synchronize", lambda device=None: counter.sync("synchronize")),
    ]
    for name, why in (("tolist", "tolist()"), ("cpu", ".cpu()"), ("numpy", ".numpy()")):
        patches.append(
            (torch.Tensor, name, _counting_method(counter, getattr(torch.Tensor, name), why))
        )
    try:  # the accelerator DeepSpeed synchronises through (``runtime.use_accelerator``)
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        patches.append((CPU_Accelerator, "synchronize", lambda *a: counter.sync("synchronize")))
    except ImportError:  # DeepSpeed is optional for the paths without an engine
        pass
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield graphs
    finally:
        for owner, name, value in reversed(saved):
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
