"""Backbone families on tiny local models (built here, saved with ``save_pretrained``): each
family's explicit group mapping and exact counts, the FPT body against the Hugging Face
model's own output, frozen weights after a step, keyed dropout, LoRA's exact parameter count,
the ablation arms, hub revisions, and the FLOP and activation rules against what torch runs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from scale_fpt import planner, scaling
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.models import build_model, families, ops
from scale_fpt.models.families import block_shape
from scale_fpt.profile import pack_problem
from scale_fpt.tasks import task_spec

D, L, HEADS, KV_HEADS, INNER = 32, 2, 4, 2, 64
"""Every tiny model: width 32, 2 blocks, 4 heads (Llama: 2 key/value heads), MLP 64 wide."""


def tiny(family: str):
    """A tiny transformers model of ``family`` (seeded, every tensor perturbed so loaded
    weights differ from a fresh init)."""
    import transformers as tr

    common = {"vocab_size": 256, "num_hidden_layers": L, "num_attention_heads": HEADS}
    if family == "gpt2":
        model = tr.GPT2Model(
            tr.GPT2Config(
                n_embd=D,
                n_layer=L,
                n_head=HEADS,
                n_inner=INNER,
                vocab_size=256,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
    elif family == "gpt-neox":
        model = tr.GPTNeoXModel(
            tr.GPTNeoXConfig(hidden_size=D, intermediate_size=INNER, rotary_pct=0.25, **common)
        )
    elif family == "llama":
        model = tr.LlamaModel(
            tr.LlamaConfig(
                hidden_size=D, intermediate_size=INNER, num_key_value_heads=KV_HEADS, **common
            )
        )
    elif family == "qwen2":  # the llama family with q/k/v biases
        model = tr.Qwen2Model(
            tr.Qwen2Config(
                hidden_size=D, intermediate_size=INNER, num_key_value_heads=KV_HEADS, **common
            )
        )
    else:
        model = tr.OPTModel(
            tr.OPTConfig(
                hidden_size=D,
                ffn_dim=INNER,
                word_embed_proj_dim=D,
                max_position_embeddings=512,
                **common,
            )
        )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model  # fmt: skip


FAMILIES = ("gpt2", "gpt-neox", "llama", "opt")
TINY_MODELS = (*FAMILIES, "qwen2")

# Backbone parameters per group, by hand from each family's published block layout.
EXPECTED_GROUPS = {
    "gpt2": {
        "ln": L * 4 * D + 2 * D,
        "pos": 1024 * D,
        "ff": L * (D * INNER + INNER + INNER * D + D),
        "attn": L * (D * 3 * D + 3 * D + D * D + D),
    },
    "gpt-neox": {  # no pos: rotary
        "ln": L * 4 * D + 2 * D,
        "ff": L * (D * INNER + INNER + INNER * D + D),
        "attn": L * (D * 3 * D + 3 * D + D * D + D),
    },
    "llama": {  # RMSNorm (no bias), gated MLP, 2 of 4 heads for keys and values, no biases
        "ln": (2 * L + 1) * D,
        "ff": L * 3 * D * INNER,
        "attn": L * (2 * D * D + 2 * D * (D * KV_HEADS // HEADS)),
    },
    "opt": {  # 512 learned positions + OPT's offset of 2
        "ln": L * 4 * D + 2 * D,
        "pos": (512 + 2) * D,
        "ff": L * (D * INNER + INNER + INNER * D + D),
        "attn": L * 4 * (D * D + D),
    },
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, str]:
    out = {}
    for i, family in enumerate(TINY_MODELS):
        torch.manual_seed(i)
        directory = tmp_path_factory.mktemp(family)
        tiny(family).save_pretrained(directory)
        out[family] = str(directory)
    return out


def build(directory: str, **flat):
    config = TrialConfig.from_flat({"task": "bit-xor", "model": directory, "dropout": 0.0, **flat})
    return build_model(config, task_spec(config.task))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_maps_every_parameter_to_its_group_exactly(family_dirs, family):
    built = build(family_dirs[family], init="pretrained", finetune="fpt")
    assert families.family_of(built.module.backbone.config).name == family
    expected = {"input": 2 * D, "output": 2 * D + 2, **EXPECTED_GROUPS[family]}  # bit-xor: 1 -> 2
    assert {g: c["total"] for g, c in built.counts.items()} == expected
    fpt = {"input", "output", "ln", "pos"}
    trained = {g: c["trainable"] for g, c in built.counts.items()}
    assert trained == {
        g: (10 * D if g == "pos" else n) if g in fpt else 0 for g, n in expected.items()
    }


def test_a_renamed_tensor_of_a_known_family_is_an_error_not_a_frozen_guess():
    gpt2 = families.BY_MODEL_TYPE["gpt2"]
    with pytest.raises(RuntimeError, match=r"no group for backbone parameter\(s\) h.0.adapter.w"):
        families.backbone_groups(gpt2, ["wpe.weight", "h.0.adapter.w"])


@pytest.mark.parametrize("family", TINY_MODELS)
def test_fpt_body_equals_the_hugging_face_models_output(family_dirs, family):
    from transformers import AutoModel

    built = build(family_dirs[family], init="pretrained")
    reference = AutoModel.from_pretrained(family_dirs[family], attn_implementation="eager")
    x = torch.randn(3, 10, D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = built.module.backbone.eval()(inputs_embeds=x).last_hidden_state
        theirs = reference.eval()(inputs_embeds=x).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)
    assert ours.abs().max() > 0.1  # not a degenerate comparison


@pytest.mark.parametrize("family", FAMILIES)
def test_a_step_changes_the_trained_groups_and_leaves_frozen_weights_equal(family_dirs, family):
    from scale_fpt.models.groups import module_groups

    built = build(family_dirs[family], init="pretrained", finetune="fpt", dropout=0.1)
    module = built.module.train()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    x = torch.randint(0, 2, (4, 10, 1)).float()
    module(x).square().mean().backward()
    optimizer.step()
    groups = module_groups(module)
    for name, p in module.named_parameters():
        changed = not torch.equal(p.detach(), before[name])
        assert changed == (groups[name] in built.trained_groups and p.grad is not None), name


def test_every_dropout_of_a_keyed_family_is_keyed(family_dirs):
    # Same (member seed, step): the same masks, so a resumed or re-run trial draws them again.
    built = build(family_dirs["gpt-neox"], init="pretrained", dropout=0.1)
    body = built.module.backbone.train()
    x = torch.randn(2, 10, D)

    def run(step):
        with torch.no_grad(), ops.dropout_keys([123], step):
            return body(inputs_embeds=x).last_hidden_state

    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))
    assert not families.BY_MODEL_TYPE["opt"].keyed_dropout


def test_plan_says_why_pos_is_empty_for_a_rotary_model(family_dirs, capsys):
    from scale_fpt import cli

    assert cli.main(["plan", "--task", "bit-xor", "--model", family_dirs["llama"]]) == 0
    out = capsys.readouterr().out
    assert "family: llama" in out
    assert "empty group pos: rotary positions" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["empty_groups"]) == {"pos"} and summary["family"] == "llama"
    assert "pos" not in summary["groups"]


def test_missing_weights_are_one_line_saying_what_to_do(tmp_path):
    tiny("gpt-neox").config.save_pretrained(tmp_path)  # a config, no weights
    with pytest.raises(ConfigError) as err:
        build(str(tmp_path), init="pretrained")
    (problem,) = err.value.problems
    assert "\n" not in problem and "--weights DIR" in problem


def test_a_random_init_preset_asked_for_weights_says_it_has_none(no_network):
    with pytest.raises(ConfigError) as err:
        build("llama-tiny", init="pretrained")
    (problem,) = err.value.problems
    assert "llama-tiny is a random-init CPU preset with no pretrained weights" in problem
    assert not no_network  # refused without asking the hub


# ------------------------------------------------------------------ LoRA


@pytest.mark.parametrize(
    ("family", "adapted"),
    [
        ("gpt2", L * ((D + 3 * D) + (D + D))),  # c_attn (d -> 3d), c_proj
        ("gpt-neox", L * ((D + 3 * D) + (D + D))),  # query_key_value, dense
        ("llama", L * (2 * (D + D) + 2 * (D + D // 2))),  # q, o; k, v at 2 of 4 heads
        ("opt", L * 4 * (D + D)),
    ],
)
def test_lora_adds_rank_times_fan_in_plus_fan_out_of_every_attention_projection(
    family_dirs, family, adapted
):
    rank = 4
    plain = build(family_dirs[family], init="pretrained")
    built = build(family_dirs[family], init="pretrained", finetune="lora", lora_rank=rank)
    assert built.counts["lora"] == {"total": rank * adapted, "trainable": rank * adapted}
    assert built.trained_groups == ("lora",)
    x = torch.randn(2, 10, 1)
    with torch.no_grad():  # B starts at zero: the adapted model starts as the plain one
        torch.testing.assert_close(built.module.eval()(x), plain.module.eval()(x))


def test_lora_whose_targets_miss_a_projection_is_refused(family_dirs, monkeypatch):
    # PEFT would adapt c_attn alone without a word; the count from the family's attention
    # projections (c_attn and c_proj) tells.
    gpt2 = families.BY_MODEL_TYPE["gpt2"]
    narrow = dataclasses.replace(gpt2, lora_targets=r".*\.attn\.c_attn")
    monkeypatch.setitem(families.BY_MODEL_TYPE, "gpt2", narrow)
    with pytest.raises(RuntimeError, match=r"PEFT added 2048 parameters, .* call for 3072"):
        build(family_dirs["gpt2"], init="pretrained", finetune="lora")


def test_lora_needs_a_transformer_body():
    with pytest.raises(ConfigError, match="--finetune lora: adapts a transformer body"):
        TrialConfig.from_flat({"model": "gpt2-tiny", "init": "no-body", "finetune": "fpt+lora"})


# ------------------------------------------------------------------ ablation arms


def test_no_body_feeds_the_input_layer_to_the_output_head(family_dirs):
    built = build(family_dirs["llama"], init="no-body")
    assert built.counts == {
        "input": {"total": 2 * D, "trainable": 2 * D},
        "output": {"total": 2 * D + 2, "trainable": 2 * D + 2},
    }
    module = built.module.eval()
    x = torch.randn(2, 10, 1)
    with torch.no_grad():
        k = module.spec.n_predicting_tokens
        expected = module.output(module.input(x)[:, -k:]).view(2, k, 1, 2)
        torch.testing.assert_close(module(x), expected)
    from scale_fpt.models import empty_groups, family_name

    assert family_name(built, "no-body") == "ablation no-body"
    assert empty_groups(built, "no-body") == {
        g: "the transformer is removed (--init no-body)" for g in ("ln", "pos", "ff", "attn")
    }
    # The same heads as the full model of the same seed: only the body differs.
    full = build(family_dirs["llama"], init="random")
    assert torch.equal(full.module.input.weight, module.input.weight)


def test_one_attn_trains_its_one_layer_whatever_finetune_says(family_dirs):
    built = build(family_dirs["gpt-neox"], init="one-attn", finetune="fpt")
    attn, ln = 4 * D * D + 4 * D, 4 * D
    assert built.counts["attn"] == {"total": attn, "trainable": attn}
    assert built.counts["ln"] == {"total": ln, "trainable": ln}
    assert built.trained_groups == ("input", "output", "ln", "attn") and built.n_layer == 1


@pytest.mark.parametrize("init", ["no-body", "one-attn"])
def test_ablation_arms_are_inits_any_grid_can_name_and_never_pack(init):
    from scale_fpt.report.tables import init_label

    flat = TrialConfig.from_flat({"model": "gpt2-tiny", "init": init}).to_flat()
    assert "ablation arm" in pack_problem(flat)
    assert init_label(init, "gpt2-tiny", "") == init


# ------------------------------------------------------------------ revisions


def fake_hub_cache(cache, repo: str, revisions: dict[str, torch.nn.Module]) -> None:
    """A Hugging Face hub cache as ``huggingface_hub`` lays it out (refs -> snapshots), one
    snapshot per revision: what a machine that downloaded those revisions holds."""
    root = cache / f"models--{repo.replace('/', '--')}"
    for i, (revision, model) in enumerate(revisions.items()):
        commit = f"{i + 1:040x}"
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / revision).write_text(commit)
        model.save_pretrained(root / "snapshots" / commit)


def test_revision_picks_that_pretraining_checkpoint_from_the_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from scale_fpt.results_schema import config_columns

    torch.manual_seed(0)
    early, late = tiny("gpt-neox"), tiny("gpt-neox")
    fake_hub_cache(tmp_path, "org/pythia-tiny", {"step1000": early, "step143000": late})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    for revision, source in (("step1000", early), ("step143000", late)):
        built = build("org/pythia-tiny", init="pretrained", revision=revision)
        torch.testing.assert_close(
            built.module.backbone.layers[0].attention.dense.weight,
            source.layers[0].attention.dense.weight,
        )
    with pytest.raises(ConfigError) as err:
        build("org/pythia-tiny", init="pretrained", revision="step5")
    (problem,) = err.value.problems
    assert "--revision 'step5'" in problem and "\n" not in problem
    assert "revision" in [f.name for f in config_columns()]


# ------------------------------------------------------------------ FLOPs and memory


@pytest.mark.parametrize("family", ["gpt-neox", "llama"])
def test_model_flops_are_what_torch_counts_on_a_real_step(family_dirs, family):
    from torch.utils.flop_counter import FlopCounterMode

    from scale_fpt.profile import step_flops
    from scale_fpt.trial import TrialRun

    batch = 4
    config = TrialConfig.from_flat(
        {"task": "bit-xor", "model": family_dirs[family], "init": "random", "batch_size": batch,
         "dropout": 0.1, "finetune": "fpt"}
    )  # fmt: skip
    run = TrialRun([config], kind="engine")
    try:
        built, spec = run.records[0].profile.built, run.records[0].profile.spec
        run.step.train_step(0)
        with FlopCounterMode(display=False) as counter:
            run.step.train_step(1)
        # The 4N/6N convention counts the input layer's input gradient and the head over
        # every token; a step runs neither (tests/test_flops.py, head_flops_not_run).
        k = spec.n_predicting_tokens
        not_run = batch * (2 * D * spec.n_tokens + (spec.n_tokens - k) * (2 * D) * 6)
        assert counter.get_total_flops() == step_flops(built, spec, batch)[0] - not_run
    finally:
        run.close()


@pytest.mark.parametrize("family", FAMILIES[:3])
def test_activation_rule_is_within_15_percent_of_what_autograd_keeps(family_dirs, family):
    config = TrialConfig.from_flat(
        {"task": "cifar10", "model": family_dirs[family], "init": "random", "finetune": "full",
         "dropout": 0.0, "input_dropout": False}
    )  # fmt: skip
    spec = task_spec(config.task)
    built = build_model(config, spec)
    module, batch = built.module.train(), 8
    embeds = module.input(torch.randn(batch, spec.n_tokens, spec.token_width)).detach()
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, int] = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        module.backbone(inputs_embeds=embeds.requires_grad_(True))
    shape = block_shape(built.module.backbone.config)
    rule = planner.activation_bytes(L, D, spec.n_tokens, batch, "fp32", shape)
    assert abs(sum(kept.values()) / rule - 1) < 0.15, (sum(kept.values()), rule)
    assert shape.activation_units == {"gpt2": 26, "gpt-neox": 26, "llama": 38}[family] * D


# ------------------------------------------------------------------ packing


@pytest.mark.parametrize("family", ["gpt-neox", "llama", "qwen2"])
def test_packed_members_equal_their_solo_deepspeed_runs_at_dropout(family_dirs, family):
    """Three members over one frozen body, at dropout 0.1: each member's curve equals its run
    alone on a DeepSpeed engine over transformers' own modules (keyed masks, same sites)."""
    from scale_fpt.profile import step_kind
    from scale_fpt.trial import TrialRun

    base = {"task": "bit-xor", "test_batches": 1, "val_batches": 1, "model": family_dirs[family],
            "init": "pretrained", "dropout": 0.1, "batch_size": 4, "max_steps": 4,
            "eval_every": 1, "log_evals": False, "accelerator": "cpu"}  # fmt: skip
    members = [{"lr": 1e-2, "seed": 0, "finetune": "fpt"},
               {"lr": 3e-3, "seed": 1, "finetune": "input+output"}]  # fmt: skip
    configs = [TrialConfig.from_flat({**base, **m}) for m in members]
    assert {step_kind(c) for c in configs} == {"cohort"}

    def losses(run_configs, kind=None):
        run = TrialRun(run_configs, kind=kind)
        try:
            run.run()
            return [[x for e in s.history for x in (e.train_loss, e.val_loss)] for s in run.states]
        finally:
            run.close()

    packed = losses(configs)
    for config, curve in zip(configs, packed, strict=True):
        (alone,) = losses([config], "engine")
        assert len(curve) == 2 * 4
        assert curve == pytest.approx(alone, rel=1e-5)
    assert packed[0] != packed[1]


def test_opt_trials_run_alone():
    # OPT's residual dropout is functional inside transformers' layer: not keyed, not packed.
    import transformers as tr

    assert families.family_of(tr.OPTConfig()).name == "opt"
    assert not families.family_of(tr.OPTConfig()).keyed_dropout


@pytest.mark.parametrize("family", ["gpt-neox", "llama"])
def test_a_packed_members_weights_carry_its_fpt_modules_names_and_values(family_dirs, family):
    from scale_fpt.models import build_heads
    from scale_fpt.models.backbones import build_backbone
    from scale_fpt.models.packed_families import PackedRotaryFPT

    config = TrialConfig.from_flat({"task": "bit-xor", "model": family_dirs[family]})
    spec = task_spec(config.task)
    alone = build_model(config, spec).module
    backbone, d_model, _ = build_backbone(config.model, 0)
    packed = PackedRotaryFPT(backbone, spec, [build_heads(spec, d_model, 0)] * 2, spec.n_tokens)
    state = packed.member_state(1)
    trained = {n: p for n, p in alone.named_parameters() if p.requires_grad}
    assert state.keys() == trained.keys()
    for name, value in state.items():
        assert torch.equal(value, trained[name].detach()), name
    assert set(packed.param_groups.values()) == {"input", "output", "ln"}


def test_pythia_ladder_has_the_published_sizes():
    """Pythia's architectures are built offline from a table: each backbone plus its untied
    input and output embeddings is the published parameter count (Biderman et al. 2023,
    Table 1), and --model builds what the table counts (on the meta device, no download)."""
    published = {"70m": 70_426_624, "160m": 162_322_944, "410m": 405_334_016,
                 "1b": 1_011_781_632, "1.4b": 1_414_647_808, "2.8b": 2_775_208_960,
                 "6.9b": 6_857_302_016, "12b": 11_846_072_320}  # fmt: skip
    assert tuple(f"EleutherAI/pythia-{n}" for n in published) == scaling.PYTHIA_LADDER
    for name, count in published.items():
        size = scaling.PYTHIA_SIZES[f"EleutherAI/pythia-{name}"]
        body = sum(scaling.neox_group_params(size).values())
        assert body + 2 * size.vocab_size * size.d_model == count, name
    for name in ("70m", "1b"):  # the table's formula is what --model builds
        model = f"EleutherAI/pythia-{name}"
        config = TrialConfig.from_flat({"task": "bit-xor", "model": model, "init": "random"})
        with torch.device("meta"):
            built = build_model(config, task_spec(config.task))
        groups = {g: c["total"] for g, c in built.counts.items() if g not in ("input", "output")}
        assert groups == scaling.neox_group_params(scaling.PYTHIA_SIZES[model])
    assert len(scaling.pythia_revisions()) == 154
    assert scaling.pythia_revisions()[:3] == ["step0", "step1", "step2"]
    assert scaling.pythia_revisions()[-1] == "step143000"


def test_a_family_entry_alone_decides_whether_and_how_it_packs(monkeypatch):
    """A family is recognised in one place: its entry says whether it packs (its packed
    model) and its block shape; packing, the planner and the packed model read nothing else."""
    from scale_fpt import profile
    from scale_fpt.models.packed_families import PackedRotaryFPT

    llama = families.BY_MODEL_TYPE["llama"]
    arch = tiny("llama").config
    assert llama.packed_class() is PackedRotaryFPT
    assert block_shape(arch).gated and block_shape(arch).rms_norm
    arm = {"model": "llama-tiny", "init": "random", "task": "bit-xor"}

    def declared(**fields) -> str | None:
        monkeypatch.setitem(families.BY_MODEL_TYPE, "llama", dataclasses.replace(llama, **fields))
        profile.config_profile.cache_clear()
        return pack_problem(arm)

    try:
        assert declared(name="toy") is None
        assert "families (this is toy)" in declared(name="toy", packed="")
        declared(gated_mlp=False, rms_norm=False)
        assert not block_shape(arch).gated and not block_shape(arch).rms_norm
    finally:
        profile.config_profile.cache_clear()
