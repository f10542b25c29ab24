"""Local pretraining: language and Bit-Memory backbones in save_pretrained format, cached and
used as ``--init pretrained``; the study machinery finds which backbones a sweep needs."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.models import build_model
from scale_fpt.pretrain import ensure_backbone, load_corpus, python_docstrings
from scale_fpt.study import local_backbones
from scale_fpt.sweep import SweepConfig
from scale_fpt.tasks import task_spec


@pytest.mark.slow
def test_default_corpus_is_english_text_from_the_standard_library():
    corpus = python_docstrings(200_000)
    text = corpus.decode("utf-8")
    assert len(text) > 100_000
    words = text.lower().split()
    assert words.count("the") > 0.02 * len(words)  # prose, not code
    assert python_docstrings(200_000) == corpus  # deterministic


def test_corpus_from_a_text_directory(tmp_path):
    (tmp_path / "a.txt").write_text("hello world. " * 1000)
    (tmp_path / "b.md").write_text("# notes\n" * 1000)
    assert load_corpus(str(tmp_path)).startswith(b"hello world.")
    (tmp_path / "a.txt").write_text("short")
    (tmp_path / "b.md").unlink()
    with pytest.raises(ConfigError, match="need at least 10,000"):
        load_corpus(str(tmp_path))


@pytest.mark.slow
def test_language_backbone_is_cached_and_loads_as_pretrained(scale_fpt_home):
    path = Path(ensure_backbone("gpt2-tiny", "language", steps=3, batch_size=2, seq_len=16))
    assert path == scale_fpt_home / "backbones" / "gpt2-tiny-language"
    info = json.loads((path / "pretrain.json").read_text())
    assert info["steps"] == 3 and info["corpus"] == "language"
    stamp = (path / "pretrain.json").stat().st_mtime_ns
    ensure_backbone("gpt2-tiny", "language", steps=3)  # cached: not rebuilt
    assert (path / "pretrain.json").stat().st_mtime_ns == stamp

    config = TrialConfig.from_flat({"task": "bit-xor", "model": "gpt2-tiny", "init": "pretrained"})
    pretrained = build_model(config, task_spec(config.task)).module.backbone
    random = build_model(config.replace(init="random"), task_spec(config.task)).module.backbone
    from transformers import GPT2Model

    saved = GPT2Model.from_pretrained(path)
    for name, tensor in pretrained.state_dict().items():
        assert torch.equal(tensor, saved.state_dict()[name]), name
    assert not torch.equal(pretrained.h[0].attn.c_attn.weight, random.h[0].attn.c_attn.weight)


@pytest.mark.slow
def test_bit_memory_backbone_for_the_modality_ablation(scale_fpt_home):
    from scale_fpt import pretrain

    args = Namespace(
        model="gpt2-tiny", corpus="bit-memory", steps=2, batch_size=2, seq_len=16,
        lr=1e-3, seed=0, out="", force=False,
    )  # fmt: skip
    assert pretrain.main(args) == 0
    path = scale_fpt_home / "backbones" / "gpt2-tiny-bit-memory"
    assert "bit-memory FPT" in json.loads((path / "pretrain.json").read_text())["source"]
    config = TrialConfig.from_flat(
        {"task": "bit-xor", "model": "gpt2-tiny", "init": "pretrained", "weights": "bit-memory"}
    )
    built = build_model(config, task_spec(config.task))
    assert built.trainable_params > 0


def test_pretrain_rejects_bad_arguments_at_once():
    from scale_fpt import cli

    code = cli.main(["pretrain", "--model", "gpt2", "--corpus", "/no/such", "--steps", "0"])
    assert code == 2


def test_sweep_needs_exactly_its_local_backbones():
    sweep = SweepConfig(
        name="s",
        base={"model": "gpt2-tiny"},
        grid={"init": ["pretrained", "random", "stats"], "weights": ["", "bit-memory"]},
    )
    assert local_backbones(sweep) == [("gpt2-tiny", "bit-memory"), ("gpt2-tiny", "language")]
    hub = SweepConfig(name="h", base={"model": "gpt2"}, grid={"init": ["pretrained"]})
    assert local_backbones(hub) == []
