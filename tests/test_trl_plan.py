"""A TRL GRPOConfig means what it means in TRL. For a dozen configurations built with TRL 1.16's own
GRPOConfig, our run plans the same completions per optimizer step, optimizer steps, learning rate at each step, seed,
clip bounds, beta and loss as TRL's trainer would, each read from TRL's / transformers' own objects (the config after
its __post_init__, transformers' Trainer.set_initial_training_values over TRL's RepeatSampler, get_scheduler);
the object and its YAML give the same plan; docs/TRL.md is the table."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo import config as C
from grpo.run.api import python_config
from grpo.run.assembly.samples import with_epochs
from grpo.run.step_owners import build_optimizer
from grpo.run.trl.config_table import DEFAULTS, ROWS, TABLE
from grpo.run.trl.docs import markdown
from grpo.run.trl.translation import translate

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
N_PROMPTS = 50
ROWS_IN = [{"prompt": f"Describe the number {i}."} for i in range(N_PROMPTS)]

CONFIGS = {  # name -> GRPOConfig fields (with use_cpu: TRL's bf16 default needs a GPU otherwise)
    "defaults": {},
    "readme": {"max_steps": 20},
    "issue_batch": {"per_device_train_batch_size": 8, "num_generations": 4, "gradient_accumulation_steps": 2,
                    "max_steps": 6},
    "group_spans_micro_batches": {"per_device_train_batch_size": 4, "num_generations": 8,
                                  "gradient_accumulation_steps": 2, "max_steps": 5},
    "group_spans_unevenly": {"per_device_train_batch_size": 6, "num_generations": 4, "gradient_accumulation_steps": 2,
                             "max_steps": 4},
    "two_epochs": {"num_train_epochs": 2, "per_device_train_batch_size": 16, "num_generations": 4},
    "epoch_and_a_half": {"num_train_epochs": 1.5, "per_device_train_batch_size": 8, "num_generations": 8,
                         "warmup_steps": 0.2},
    "cosine_warmup_ratio": {"max_steps": 12, "lr_scheduler_type": "cosine", "warmup_steps": 0.25,
                            "learning_rate": 3e-5},
    "constant_with_warmup": {"max_steps": 10, "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 3},
    "constant_ignores_warmup": {"max_steps": 10, "lr_scheduler_type": "constant", "warmup_steps": 3},
    "linear_mu2": {"max_steps": 8, "lr_scheduler_type": "linear", "warmup_steps": 2, "num_iterations": 2},
    "grpo_loss_beta": {"max_steps": 3, "loss_type": "grpo", "beta": 0.04, "epsilon": 0.3, "epsilon_high": 0.4,
                       "seed": 7},
    "dr_grpo_sequence": {"max_steps": 3, "loss_type": "dr_grpo", "importance_sampling_level": "sequence",
                         "scale_rewards": False, "max_completion_length": 32},
    "save_and_evaluate_each_epoch": {"num_train_epochs": 2, "per_device_train_batch_size": 8, "num_generations": 4,
                                     "save_strategy": "epoch", "eval_strategy": "epoch"},
    "epoch_ends_under_max_steps_mu2": {"max_steps": 30, "num_iterations": 2, "num_generations": 8,
                                       "save_strategy": "epoch", "eval_strategy": "epoch"},
    "save_and_evaluate_by_steps": {"max_steps": 12, "save_strategy": "steps", "save_steps": 4,
                                   "eval_strategy": "steps", "eval_steps": 3},
}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


def trl_args(fields: dict, tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, **fields)


def trl_plan(args) -> dict:
    """What TRL's trainer does with `args`, read from TRL's and transformers' objects."""
    from torch.utils.data import DataLoader
    from transformers import Trainer, get_scheduler
    from trl.trainer.utils import RepeatSampler

    k = args.num_generations
    sampler = RepeatSampler(list(range(N_PROMPTS)), mini_repeat_count=k, batch_size=args.generation_batch_size // k,
                            repeat_count=args.num_iterations * args.steps_per_generation, shuffle=True, seed=args.seed)
    loader = DataLoader(list(range(N_PROMPTS)), sampler=sampler,  # GRPOTrainer.get_train_dataloader's batch size
                        batch_size=args.per_device_train_batch_size * args.steps_per_generation)
    trainer = SimpleNamespace(get_total_train_batch_size=lambda a: a.per_device_train_batch_size
                              * a.gradient_accumulation_steps * a.world_size,
                              get_sp_size=lambda: 1, num_examples=lambda dl: len(dl.dataset))
    values = Trainer.set_initial_training_values(trainer, args, loader)
    steps, per_epoch = values[-1], values[1]  # optimizer steps: the run's, an epoch's
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=args.learning_rate)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(steps),
                              num_training_steps=steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # completions per optimizer step: a generation batch feeds steps_per_generation / gradient_accumulation_steps steps
    per_step = args.generation_batch_size * args.gradient_accumulation_steps // args.steps_per_generation

    def every(strategy, steps):  # transformers' DefaultFlowCallback: every `steps` optimizer steps, or each epoch's end
        return {"steps": steps, "epoch": per_epoch, "no": 0}[strategy.value]

    return {"completions": per_step, "micro_batch": args.per_device_train_batch_size, "steps": steps, "lrs": lrs,
            "save_every": every(args.save_strategy, args.save_steps),
            "eval_every": every(args.eval_strategy, args.eval_steps),
            "seed": args.seed, "clip": (args.epsilon, args.epsilon_high if args.epsilon_high is not None
                                        else args.epsilon),  # GRPOTrainer.__init__: epsilon_high defaults to epsilon
            "beta": args.beta}


def our_plan(cfg: C.Config) -> dict:
    cfg = with_epochs(cfg, {"t": ROWS_IN}, world=1, announce=False)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build_optimizer(cfg.train, [param], cfg.total_updates)
    lrs = []
    for _ in range(cfg.total_updates):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    beta = cfg.kl["default"].beta if cfg.kl["default"].controller == "fixed" else None
    return {"completions": cfg.seqs_per_step, "micro_batch": cfg.micro_batch_seqs, "steps": cfg.total_updates,
            "lrs": lrs, "save_every": cfg.checkpoint.every * cfg.loss.mu,
            "eval_every": cfg.train.eval_every * cfg.loss.mu,
            "seed": cfg.train.seed, "clip": (cfg.loss.clip_low, cfg.loss.clip_high), "beta": beta}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_our_plan_is_trls(name, tmp_path):
    args = trl_args(CONFIGS[name], tmp_path)
    cfg, _ = python_config(None, {"t": ROWS_IN}, {"t": [reward_len]}, None, {}, trl_args=args)
    theirs, ours = trl_plan(args), our_plan(cfg)
    assert ours["lrs"] == pytest.approx(theirs["lrs"], rel=1e-12, abs=1e-15)
    assert {k: v for k, v in ours.items() if k != "lrs"} == {k: v for k, v in theirs.items() if k != "lrs"}
    assert cfg.rollout.k == args.num_generations and cfg.loss.mu == args.num_iterations
    assert cfg.rollout.max_new_tokens == args.max_completion_length
    assert cfg.loss.adv_scale == args.scale_rewards  # resolved by TRL's __post_init__ (False -> "none")
    expected_ratio = {"token": "grpo", "sequence": "gspo"}
    assert cfg.loss.policy_loss == expected_ratio[args.importance_sampling_level]


LOSSES = {  # name -> GRPOConfig fields: every loss_type TABLE translates (TRL 1.16's), each importance level
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo", "max_completion_length": 12},
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28},
    "cispo": {"loss_type": "cispo", "epsilon_high": 1.2},
    "sapo": {"loss_type": "sapo", "sapo_temperature_neg": 1.3},
    "vespo": {"loss_type": "vespo"},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "dapo_kl": {"loss_type": "dapo", "beta": 0.04, "use_bias_correction_kl": False},
    "dapo_kl_bias_corrected": {"loss_type": "dapo", "beta": 0.04},  # TRL's default use_bias_correction_kl=True
    "gspo_kl_bias_corrected": {"loss_type": "grpo", "importance_sampling_level": "sequence", "beta": 0.1},
    "cispo_kl_bias_corrected": {"loss_type": "cispo", "beta": 0.1, "epsilon_high": 5.0},
    "grpo_kl": {"loss_type": "grpo", "beta": 0.1, "use_bias_correction_kl": False, "epsilon": 0.1},
    "dapo_entropy_bonus": {"loss_type": "dapo", "entropy_coef": 0.05},
    "bnpo_entropy_bonus": {"loss_type": "bnpo", "entropy_coef": 0.05},
    "dapo_top_entropy": {"loss_type": "dapo", "top_entropy_quantile": 0.4},
    "grpo_top_entropy": {"loss_type": "grpo", "top_entropy_quantile": 0.25},
}


class FixedForward(torch.nn.Module):
    """A causal LM whose forward returns fixed log-probs and entropies of the completion tokens, whatever its input,
    as TRL 1.16 asks its model for them (`model(..., labels=..., fused_lm_head=True).log_probs` / `.entropy`, one per
    position; the prompt's positions are not read). `logps_BT` is the parameter the loss's gradient reaches."""

    def __init__(self, logps_BT: torch.Tensor, entropy_BT: torch.Tensor, prompt_len: int):
        super().__init__()
        self.logps_BT = torch.nn.Parameter(logps_BT.clone())
        self.entropy_BT, self.prompt_len = entropy_BT, prompt_len

    def forward(self, input_ids, attention_mask, labels=None, fused_lm_head=True):
        pad_BP = torch.zeros(input_ids.shape[0], self.prompt_len)
        return SimpleNamespace(log_probs=torch.cat([pad_BP, self.logps_BT], 1),
                               entropy=torch.cat([pad_BP, self.entropy_BT], 1))


def trl_compute_loss(args, model: FixedForward, inputs: dict) -> torch.Tensor:
    """TRL's own GRPOTrainer._compute_loss (and its _get_per_token_logps_and_entropies) on a stand-in trainer holding
    what they read, set from `args` as GRPOTrainer.__init__ sets it; one process, the whole batch one micro-batch."""
    from collections import defaultdict
    from contextlib import nullcontext

    from trl.trainer.grpo_trainer import GRPOTrainer

    identity = lambda x, *a, **k: x  # noqa: E731 - one process: gather / reduce return their input
    fake = SimpleNamespace(
        args=args, model=SimpleNamespace(training=True), loss_type=args.loss_type, beta=args.beta,
        epsilon_low=args.epsilon, epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level, top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=args.off_policy_mask_threshold, max_completion_length=args.max_completion_length,
        use_vllm=args.use_vllm, vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        entropy_coef=args.entropy_coef, use_adaptive_entropy=args.use_adaptive_entropy,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy, aux_loss_enabled=False,
        current_gradient_accumulation_steps=args.gradient_accumulation_steps,
        _metrics=defaultdict(lambda: defaultdict(list)), get_gamma_weights=GRPOTrainer.get_gamma_weights,
        accelerator=SimpleNamespace(autocast=nullcontext, num_processes=1, gather=identity, reduce=identity,
                                    gather_for_metrics=identity, pad_across_processes=identity, sync_gradients=True,
                                    is_main_process=True))
    fake._get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies.__get__(fake)
    fake.get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask.__get__(fake)
    return GRPOTrainer._compute_loss(fake, model, inputs)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_our_loss_is_trls_compute_loss(name, tmp_path, monkeypatch):
    """The loss and its gradient of our update (grpo/phases/update.micro_batch_terms + aggregate over the step, as
    update_passes does) equal TRL 1.16's own GRPOTrainer._compute_loss on the same log-probs, old and reference
    log-probs, advantages and mask, for every loss_type TABLE translates: off-policy ratios (some clipped), negative and
    positive advantages, completions of different lengths."""
    from grpo.core.losses import aggregate
    from grpo.core.step_types import TrainBatch
    from grpo.phases import update

    args = trl_args({"max_steps": 1, **LOSSES[name]}, tmp_path)
    cfg, _ = python_config(None, {"t": ROWS_IN}, {"t": [reward_len]}, None, {}, trl_args=args)
    g = torch.Generator().manual_seed(3)
    B, P, T = 6, 3, 9
    logps_BT = -torch.rand(B, T, generator=g) * 3 - 0.05
    old_BT = logps_BT + (torch.rand(B, T, generator=g) - 0.5) * 0.6  # ratios from ~0.74 to ~1.35
    ref_BT = logps_BT + (torch.rand(B, T, generator=g) - 0.5) * 0.4
    entropy_BT = torch.rand(B, T, generator=g)
    mask_BT = torch.ones(B, T)
    for row, length in enumerate([9, 4, 7, 1, 6, 8]):
        mask_BT[row, length:] = 0.0
    advantages_B = torch.tensor([1.2, -0.7, 0.3, -1.5, 0.9, -0.2])
    ids_BT = torch.randint(5, 50, (B, T), generator=g)

    theirs_model = FixedForward(logps_BT, entropy_BT, P)
    inputs = {"prompt_ids": torch.randint(5, 50, (B, P), generator=g),
              "prompt_mask": torch.ones(B, P, dtype=torch.long),
              "completion_ids": ids_BT, "completion_mask": mask_BT.long(), "advantages": advantages_B,
              "old_per_token_logps": old_BT, "num_items_in_batch": mask_BT.sum()}
    if args.beta:
        inputs["ref_per_token_logps"] = ref_BT
    theirs = trl_compute_loss(args, theirs_model, inputs)
    theirs.backward()

    ours_logps_BT = torch.nn.Parameter(logps_BT.clone())
    monkeypatch.setattr(update, "completion_logprobs", lambda *a, **k: (ours_logps_BT, entropy_BT))  # the forward
    batch = TrainBatch(input_ids_BL=torch.cat([inputs["prompt_ids"], ids_BT], 1),
                       attention_mask_BL=torch.cat([inputs["prompt_mask"], mask_BT.long()], 1),
                       completion_mask_BT=mask_BT, prompt_len=P, task_ids_B=torch.zeros(B, dtype=torch.long),
                       advantages_B=advantages_B, old_logps_BT=old_BT, ref_logps_BT=ref_BT if args.beta else None)
    if cfg.loss.top_entropy_quantile < 1.0:  # the step's entropy mask, from the rollout policy's entropies (= these)
        monkeypatch.setattr(update, "batch_entropies", lambda *a, **k: entropy_BT)
        update.select_top_entropy(None, batch, cfg.loss.top_entropy_quantile,
                                  update.StepSettings(micro_batch_seqs=B, temperature=1.0, max_grad_norm=1.0,
                                                      skip_grad_norm=1.0))
        assert 0 < batch.entropy_mask_BT.sum() < mask_BT.sum()
    betas_N = torch.tensor([cfg.kl["default"].beta])
    pg_BT, reg_BT, mask, _ = update.micro_batch_terms(None, batch, betas_N, cfg.loss, 1.0, fused_head=False)
    ours = aggregate(pg_BT + reg_BT, mask, cfg.loss.agg_mode, num_tokens=batch.num_tokens, num_seqs=batch.size,
                     constant=float(cfg.rollout.max_new_tokens))  # StepSettings.agg_constant
    ours.backward()
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours_logps_BT.grad, theirs_model.logps_BT.grad, rtol=1e-5, atol=1e-7)
    assert theirs_model.logps_BT.grad.abs().sum() > 0  # the comparison can tell losses apart


@pytest.mark.parametrize("name", ["defaults", "issue_batch", "group_spans_micro_batches", "linear_mu2",
                                  "dr_grpo_sequence", "save_and_evaluate_each_epoch"])
def test_the_object_and_its_yaml_give_the_same_plan(name, tmp_path, capsys):
    import yaml

    import grpo_train

    fields = {"output_dir": str(tmp_path / "out"), "use_cpu": True, **CONFIGS[name]}
    from_object, _ = python_config(None, {"t": ROWS_IN}, {"t": [reward_len]}, None, {},
                                   trl_args=trl_args(CONFIGS[name], tmp_path))
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(fields))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS_IN))
    assert grpo_train.cli(["--config", str(path), "--tasks.t.path", str(data), "--print-config"]) == 0
    from_yaml = C.from_dict(json.loads(capsys.readouterr().out))
    assert from_yaml.preset == "custom" and set(from_yaml.tasks) == {"t"}  # the user's task only, not the demo's
    assert our_plan(from_yaml) == our_plan(from_object)
    for section in ("train", "rollout", "loss", "model", "checkpoint"):
        # the same settings, named the user's way: TRL's flags for the file, fields for the object
        if section == "train":
            yaml_names, object_names = from_yaml.train.trl_names, from_object.train.trl_names
            assert all(object_names.get(field) == name.removeprefix("--") for field, name in yaml_names.items())
            assert {"rollout.k", "train.lr", "rollout.max_new_tokens"} <= set(yaml_names)
            assert dataclasses.replace(from_yaml.train, trl_names={}) == dataclasses.replace(from_object.train,
                                                                                            trl_names={})
            continue
        assert getattr(from_yaml, section) == getattr(from_object, section), section


def test_the_issues_batch_trains_16_completions_a_step_not_64(tmp_path):
    """The object's per_device_train_batch_size=8 equals TRL's default and still counts: translated to nothing, it
    would leave the preset's 8 prompts (8 x K 4 x GA 2 = 64)."""
    args = trl_args(CONFIGS["issue_batch"], tmp_path)
    cfg, _ = python_config(None, {"t": ROWS_IN}, {"t": [reward_len]}, None, {}, trl_args=args)
    assert cfg.seqs_per_step == 16 and cfg.prompts_per_step == 4


def test_trl_defaults_apply_not_the_presets(tmp_path):
    cfg, _ = python_config(None, {"t": ROWS_IN}, {"t": [reward_len]}, None, {}, trl_args=trl_args({}, tmp_path))
    assert (cfg.train.seed, cfg.loss.clip_low, cfg.loss.clip_high, cfg.train.lr) == (42, 0.2, 0.2, 1e-6)
    assert (cfg.train.lr_scheduler, cfg.train.num_epochs, cfg.loss.agg_mode) == ("linear", 3.0, "token-mean")
    assert cfg.model.dtype == "float32"  # bf16 resolved True by TRL, but the run is on the CPU: named, not switched on
    out = str(tmp_path / "out")  # output_dir gets the final model (TRL's save_model), the run folder inside it
    assert (cfg.checkpoint.final_model_dir, cfg.train.output_dir, cfg.train.run_name) == (out, out, "grpo-dual")
    assert ((cfg.train.log_every, cfg.train.sample_every, cfg.checkpoint.every, cfg.checkpoint.keep_last) ==
            (10, 0, 500, 0))


def test_the_table_holds_trls_defaults_and_every_field_outside_it_is_refused_when_set(tmp_path):
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig) if f.init}
    for name, default in DEFAULTS.items():
        f = fields[name]
        assert (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default) == default, name
    with pytest.raises(C.ConfigError, match=r"\['dataloader_num_workers', 'use_vllm'\]") as err:
        translate(trl_args({"use_vllm": True, "dataloader_num_workers": 2}, tmp_path))
    assert err.value.field == "dataloader_num_workers"
    with pytest.raises(C.ConfigError, match=r"\['use_vllm'\]"):
        translate({"use_vllm": True})
    assert translate({"push_to_hub": False}).tree == translate({}).tree  # TRL's default is accepted


def test_what_cannot_be_honoured_is_refused_or_named(tmp_path):
    for fields, message in [({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type"),
                            ({"steps_per_generation": 4}, "generates once per optimizer step"),
                            ({"max_steps": 7, "num_iterations": 2}, "multiple of 2"),
                            ({"save_strategy": "best"}, "use steps, epoch or no"),
                            ({"eval_strategy": "best"}, "use steps, epoch or no"),
                            ({"adam_beta1": 0.8}, "torch's betas"),
                            # TRL's trainer refuses it
                            ({"importance_sampling_level": "sequence_token"}, "TRL 1.16 has"),
                            ({"num_generations": 8, "per_device_train_batch_size": 3}, "e.g. "
                             "per_device_train_batch_size=8")]:
        with pytest.raises(C.ConfigError, match=message):
            translate(fields)
    for loss_type in ("grpo", "dr_grpo"):  # TRL token-means the entropy bonus; grpo-dual as the loss (agg_mode)
        assert [n for n in translate({"loss_type": loss_type, "entropy_coef": 0.05}).notes
                if n.startswith("GRPOConfig.entropy_coef=0.05: applied, the entropy bonus averaged as the loss is")]
    assert not [n for n in translate({"loss_type": "dapo", "entropy_coef": 0.05}).notes if "entropy" in n]
    notes = translate({"disable_dropout": True, "beta": 0.1, "lr_scheduler_type": "constant", "warmup_steps": 5}).notes
    named = [n.split(":")[0] for n in notes]
    # (bf16)
    assert {"GRPOConfig.warmup_steps=5.0", "GRPOConfig.disable_dropout=True"} <= set(named) and len(named) <= 3
    assert "GRPOConfig.use_bias_correction_kl=True" not in named  # applied: loss.kl_importance_weight


def test_a_misspelt_grpo_config_field_gets_a_did_you_mean(tmp_path, capsys):
    import grpo_train

    with pytest.raises(C.ConfigError, match=r"did you mean `num_generations`\?") as err:
        translate({"num_generation": 4})
    assert err.value.field == "num_generation"
    path = tmp_path / "grpo.yaml"
    path.write_text("num_generation: 4\nlearning_rate: 1.0e-5\n")
    assert grpo_train.cli(["--config", str(path)]) == 2
    err_text = capsys.readouterr().err
    assert "did you mean `num_generations`?" in err_text and "leave them at TRL's defaults" not in err_text
    path.write_text("learning_rate: 1.0e-5\nrollout:\n  k: 4\n")  # a section among TRL's fields
    assert grpo_train.cli(["--config", str(path)]) == 2
    assert "mixes grpo-dual's sections with TRL's fields ['learning_rate']" in capsys.readouterr().err


def test_docs_trl_md_is_the_table():
    assert (ROOT / "docs" / "TRL.md").read_text() == markdown()
    assert len(TABLE) == len(ROWS)
    custom = (ROOT / "docs" / "CUSTOM_TASKS.md").read_text()  # it never mentioned GRPOConfig
    assert "](TRL.md)" in custom and "GRPOConfig" in custom
    diff = custom.split("### 5.1", 1)[1].split("```diff\n", 1)[1].split("```", 1)[0].splitlines()
    # the TRL script, before and after: one import line
    changed = [line for line in diff if line.startswith(("+", "-"))]
    assert changed == ["-from trl import GRPOConfig, GRPOTrainer", "+from grpo_train import GRPOConfig, GRPOTrainer"]


def test_bf16_means_bfloat16_weights_on_a_gpu_and_is_named_not_switched_on_on_the_cpu(monkeypatch, tmp_path):
    """TRL resolves bf16=None to True (unless fp16). On a GPU: model.dtype bfloat16; on the CPU: float32, and a note
    only when bf16 was set true (TRL's default left unset is no request: every CPU run of a GPU-less machine printed
    it, a GRPOConfig object's resolved True included)."""
    on_cpu = translate({"use_cpu": True})
    assert on_cpu.tree["model"]["dtype"] == "float32" and not [n for n in on_cpu.notes if "bf16" in n]
    asked = translate({"use_cpu": True, "bf16": True})
    assert asked.tree["model"]["dtype"] == "float32" and any(n.startswith("GRPOConfig.bf16=True") for n in asked.notes)
    unset = translate(trl_args({}, tmp_path))  # the object holds bf16=True, TRL's resolved default
    assert unset.tree["model"]["dtype"] == "float32" and not [n for n in unset.notes if "bf16" in n]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_gpu = translate({})
    assert on_gpu.tree["model"]["dtype"] == "bfloat16" and not [n for n in on_gpu.notes if "bf16" in n]
    assert translate({"bf16": False}).tree["model"]["dtype"] == "float32"
    assert translate({"fp16": True}).tree["model"]["dtype"] == "float16"
    loaded = translate({"model_init_kwargs": {"torch_dtype": torch.float32, "attn_implementation": "eager"}}).tree
    assert (loaded["model"]["dtype"], loaded["model"]["attn_implementation"]) == ("float32", "eager")
    with pytest.raises(C.ConfigError, match=r"\['device_map'\] are not translated"):
        translate({"model_init_kwargs": {"device_map": "auto"}})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert translate({}).tree["model"]["dtype"] == "float32"  # no GPU here: the CPU's rule


def test_the_memory_estimate_sees_a_micro_batch_that_splits_a_group():
    from grpo.run.assembly.memory_inputs import inputs_from_config

    cfg = C.from_dict(C.config_tree("custom", [], translate(
        {"per_device_train_batch_size": 4, "num_generations": 8, "gradient_accumulation_steps": 2,
         "max_completion_length": 64}).tree))  # within builtin:tiny's 512 positions, as the estimate requires
    x = inputs_from_config(cfg)
    assert (x.micro_batch_seqs, x.gen_batch_seqs) == (4, 8)
