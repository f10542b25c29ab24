"""Pretraining CPU-sized backbones locally, for studies that cannot fetch hub weights.

``language``: a GPT-2 language model over UTF-8 bytes of English text (by default the
docstrings of the Python standard library, present on every Python installation; or any text
file / directory of ``.txt``/``.md`` files the user names). ``bit-memory``: the backbone of an
FPT fully trained on Bit Memory (the paper's pretraining-modality ablation). Either is saved
with ``save_pretrained`` and used as ``--model DIR --init pretrained`` (or, for the preset's
default language backbone, simply ``--model gpt2-tiny --init pretrained``).
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import json
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from filelock import FileLock

from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.models.backbones import (
    CPU_PRESETS,
    gpt2_config,
    local_backbone_dir,
    quiet_transformers,
)
from scale_fpt.runtime import flush_denormals
from scale_fpt.scaling import GPT2_SIZES
from scale_fpt.trial import TrialRun

CORPORA = ("language", "bit-memory")


def main(args: argparse.Namespace) -> int:
    """``scale-fpt pretrain`` (its flags: ``cli.add_pretrain_flags``)."""
    problems = []
    if args.model not in CPU_PRESETS:
        problems.append(f"--model: pretrain makes CPU presets only ({', '.join(CPU_PRESETS)})")
    if args.corpus not in CORPORA and not Path(args.corpus).exists():
        problems.append(f"--corpus: {args.corpus!r} is neither {' nor '.join(CORPORA)} nor a path")
    for name in ("steps", "batch_size", "seq_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')}: must be >= 1")
    if problems:
        raise ConfigError(problems)
    out = ensure_backbone(
        args.model,
        args.corpus,
        out=args.out or None,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        seed=args.seed,
        force=args.force,
    )
    print(json.dumps(json.loads((Path(out) / "pretrain.json").read_text())))
    return 0


def corpus_name(corpus: str) -> str:
    return corpus if corpus in CORPORA else "text-" + Path(corpus).stem


def ensure_backbone(
    preset: str, corpus: str = "language", out: str | None = None, force=False, **kw
) -> str:
    """The directory of a pretrained preset, building it once (under a lock, so concurrent
    callers wait for one build instead of racing)."""
    target = Path(out) if out else local_backbone_dir(preset, corpus_name(corpus))
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        if force or not (target / "pretrain.json").exists():
            build_backbone_dir(preset, corpus, target, **kw)
    return str(target)


def build_backbone_dir(
    preset: str,
    corpus: str,
    target: Path,
    steps: int | None = None,
    batch_size: int = 16,
    seq_len: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> None:
    started = time.perf_counter()
    steps = steps or GPT2_SIZES[preset].pretrain_steps
    if corpus == "bit-memory":
        backbone, final_loss, source = pretrain_on_bit_memory(preset, steps, lr, seed)
    else:
        text = load_corpus(corpus)
        backbone, final_loss = pretrain_language(preset, text, steps, batch_size, seq_len, lr, seed)
        source = f"{corpus} ({len(text):,} bytes)"
    tmp = target.with_name(f".{target.name}.tmp")
    with quiet_transformers():
        backbone.save_pretrained(tmp)
    info = {
        "preset": preset,
        "corpus": corpus,
        "source": source,
        "steps": steps,
        "final_loss": final_loss,
        "seconds": round(time.perf_counter() - started, 1),
        "directory": str(target),
    }
    (tmp / "pretrain.json").write_text(json.dumps(info, indent=1))
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)


def load_corpus(corpus: str, limit: int = 1_000_000) -> bytes:
    if corpus == "language":
        return python_docstrings(limit)
    path = Path(corpus)
    files = sorted(path.rglob("*.txt")) + sorted(path.rglob("*.md")) if path.is_dir() else [path]
    data = b"\n\n".join(f.read_bytes() for f in files)[:limit]
    if len(data) < 10_000:
        raise ConfigError(
            [f"--corpus: {corpus} has {len(data)} bytes of text; need at least 10,000"]
        )
    return data


def python_docstrings(limit: int) -> bytes:
    """English prose from the standard library's docstrings (sorted files: deterministic)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in [tree, *documented_definitions(tree)]:
            doc = ast.get_docstring(node)
            if doc and len(doc) > 80:
                chunk = doc.encode("utf-8", "ignore")
                chunks.append(chunk)
                size += len(chunk) + 2
        if size >= limit:
            break
    return b"\n\n".join(chunks)[:limit]


STATEMENT_LIKE = (ast.stmt, ast.ExceptHandler, ast.match_case)
"""Nodes whose descendants may hold a statement (a handler's or a case's body)."""


def documented_definitions(tree: ast.Module) -> list[ast.FunctionDef | ast.ClassDef]:
    """The module's functions and classes in ``ast.walk``'s order (breadth first), walking
    statements only: a definition is a statement, and expressions, which hold none, are most
    of a tree's nodes (a full walk cost as much as the parse)."""
    found, queue = [], collections.deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.append(node)
        queue.extend(
            child for child in ast.iter_child_nodes(node) if isinstance(child, STATEMENT_LIKE)
        )
    return found


def pretrain_language(preset, text: bytes, steps, batch_size, seq_len, lr, seed):
    from transformers import GPT2LMHeadModel

    flush_denormals()
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt2_config(GPT2_SIZES[preset], dropout=0.1))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
        window = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])  # (B, L+1)
        logits = model(input_ids=window[:, :-1]).logits  # (B, L, 256)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    tail = losses[-50:]
    return model.transformer, sum(tail) / len(tail)


def pretrain_on_bit_memory(preset, steps, lr, seed):
    """Train a whole FPT on Bit Memory through the normal trial path; keep its backbone."""
    from torch import nn

    config = TrialConfig.from_flat(
        {
            "task": "bit-memory",
            "model": preset,
            "init": "random",
            "finetune": "full",
            "lr": min(lr, 1e-4),
            "max_steps": steps,
            "eval_every": steps,
            "log_evals": False,
            "seed": seed,
        }
    )
    trial = TrialRun([config], sweep="pretrain")
    with contextlib.ExitStack() as stack:
        stack.callback(trial.close)
        (row,) = trial.run()
        backbone = trial.step.engine.module.backbone
        # The word embedding was dropped (never used); give the saved model an untrained one
        # so it loads like any save_pretrained GPT-2.
        backbone.set_input_embeddings(
            nn.Embedding(backbone.config.vocab_size, backbone.config.n_embd)
        )
        source = f"bit-memory FPT, test accuracy {row['final_test_accuracy']:.3f}"
        return backbone, row["final_test_loss"], source
