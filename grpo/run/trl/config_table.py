"""TRL's GRPOConfig in grpo-dual's terms: TABLE.

A GRPOConfig object (`train(..., args=GRPOConfig(...))`), its dict or such a file is the whole
configuration, as in TRL: every field of TABLE applies with its value, TRL's defaults included (a field missing from a
file or dict has TRL 1.16's default, TABLE's `default` column), so an object and the file of the same fields give the
same run. Each row of TABLE is a TRL field, the grpo-dual field(s) it sets and the rule (its converter:
grpo/run/trl/config_rules.py); TABLE is the documentation (docs/TRL.md is generated from it and the other records'
tables, grpo/run/trl/record_tables.py RECORDS: `python -m grpo.run.trl.docs > docs/TRL.md`, checked by
tests/test_trl_plan.py). grpo/run/trl/translation.py applies it to a GRPOConfig. Config files and TRL's command line
(the four records of `trl grpo`) are read by grpo/run/trl/command_line.py.
A field outside TABLE must keep TRL's default: a value set there is a ConfigError naming it. A value a row cannot
honour is either refused by name or, where grpo-dual does something close, applied and named in a note (printed).
What grpo-dual adds (the SFT warm-up, per-task KL bands of a preset, the doctor, the graders, the held-out
evaluations) keeps grpo-dual's defaults: the preset `custom` for a TRL config file, `train`'s for an object.
"""

from __future__ import annotations

from grpo.run.trl.config_rules import (
    IS_LEVELS,
    LOSS_TYPE_AGG,
    TRL_RUN_FOLDER,
    _adaptive_entropy,
    _batch,
    _best_model,
    _beta,
    _completion_length,
    _device,
    _entropy_coef,
    _entropy_target,
    _epsilon,
    _evaluating,
    _generation,
    _logging,
    _loss_param,
    _loss_type,
    _model_init,
    _none_is,
    _output_dir,
    _precision,
    _report_to,
    _saving,
    _scale_rewards,
    _scheduler,
    _steps,
    _tool_turns,
)
from grpo.run.trl.rows import Row, _noted, _only, _part_of, bind

R = Row
TABLE: tuple[Row, ...] = (
    # --- the batch and the length of the run
    R("per_device_train_batch_size", "train.prompts_per_micro_step, train.grad_accum, train.micro_batch_size, "
      "train.split_groups", 8,
      "completions per micro-batch: with gradient_accumulation_steps and num_generations, one generation of "
      "per_device_train_batch_size x gradient_accumulation_steps / num_generations prompts per optimizer step (a "
      "multiple of num_generations, as TRL requires). A multiple of num_generations: prompts_per_micro_step = it / "
      "num_generations, grad_accum = gradient_accumulation_steps; else a group spans micro-batches: "
      "micro_batch_size = it, the same optimizer step as on the whole batch; under several processes whose "
      "completions together hold whole groups, a group may span processes (split_groups)", _batch),
    R("gradient_accumulation_steps", "train.grad_accum", 1, "see per_device_train_batch_size",
      _part_of("per_device_train_batch_size"), copies="train.grad_accum"),
    R("num_generations", "rollout.k", 8, "completions per prompt (the group)"),
    R("steps_per_generation", "", None, "unset (= gradient_accumulation_steps: one generation per optimizer step) "
      "only", _generation),
    R("generation_batch_size", "", None, "unset (= the optimizer step's completions) only",
      _part_of("steps_per_generation")),
    R("max_steps", "train.max_steps, train.num_epochs", -1,
      "> 0: optimizer steps, so max_steps / num_iterations RL steps (a multiple of num_iterations); <= 0: "
      "num_train_epochs decides", _steps),
    R("num_train_epochs", "train.num_epochs", 3.0,
      "passes over the training prompts when max_steps <= 0: ceil(num_train_epochs x (prompts // prompts a step)) RL "
      "steps, as TRL counts them (the last incomplete batch of an epoch dropped), over every training row, as in TRL "
      "(data.heldout_fraction=0: the held-out rows are an eval split's only); the prompts' order is grpo-dual's "
      "task-balanced sampler's", _part_of("max_steps"), copies="train.num_epochs"),
    R("num_iterations", "loss.mu", 1, "optimizer steps per generation"),
    R("shuffle_dataset", "", True, "true only", _only(True, "the sampler always shuffles")),
    # --- the optimizer and its schedule
    R("learning_rate", "train.lr", 1e-6, "the peak learning rate"),
    R("lr_scheduler_type", "train.lr_scheduler, train.warmup_steps, train.warmup_ratio", "linear",
      "linear, cosine, constant_with_warmup (train.lr_scheduler=constant) or constant (no warm-up, as in TRL), over "
      "the run's optimizer steps, with transformers' formulas", _scheduler),
    R("warmup_steps", "train.warmup_steps, train.warmup_ratio", 0,
      ">= 1: warmup_steps (whole steps, as int() gives); in (0, 1): warmup_ratio", _part_of("lr_scheduler_type"),
      copies="train.warmup_steps"),
    R("lr_scheduler_kwargs", "", None, "unset only", _part_of("lr_scheduler_type")),
    R("weight_decay", "train.weight_decay", 0.0, "AdamW's weight decay"),
    R("max_grad_norm", "train.max_grad_norm", 1.0, "the gradient-norm clip"),
    R("optim", "", "adamw_torch_fused", "adamw_torch_fused or adamw_torch only",
      _only(("adamw_torch_fused", "adamw_torch"), "grpo-dual's optimizer is torch's AdamW (fused where it applies)")),
    R("adam_beta1", "", 0.9, "0.9 only", _only(0.9, "grpo-dual's AdamW keeps torch's betas (0.9, 0.999)")),
    R("adam_beta2", "", 0.999, "0.999 only", _only(0.999, "grpo-dual's AdamW keeps torch's betas (0.9, 0.999)")),
    R("adam_epsilon", "", 1e-8, "1e-8 only", _only(1e-8, "grpo-dual's AdamW keeps torch's eps 1e-8")),
    R("seed", "train.seed", 42, "seeds python, numpy and torch"),
    # --- the loss
    R("beta", "kl.default (controller fixed, beta)", 0.0,
      "a fixed KL coefficient for every task without a kl.<task> entry of its own (0: no reference model pass)",
      _beta, copies="kl.default.beta"),
    R("use_bias_correction_kl", "loss.kl_importance_weight", True, "copied: the KL term times the importance ratio "
      "(its gradient too), as TRL", _part_of("beta")),
    R("epsilon", "loss.clip_low, loss.clip_high", 0.2, "the lower clip; also the upper one when epsilon_high is "
      "unset, as in TRL", _epsilon, copies="loss.clip_low"),
    R("epsilon_high", "loss.clip_high (loss.params.cispo_max_ratio under cispo)", None, "the upper clip (cispo: the "
      "ratio's cap)", _part_of("epsilon"), copies="loss.clip_high"),
    R("loss_type", "loss.agg_mode, loss.policy_loss", "dapo",
      "how the token losses are averaged (" + ", ".join(f"{k} -> {v}" for k, v in LOSS_TYPE_AGG.items())
      + "); cispo, sapo, vespo and luspo are also loss.policy_loss", _loss_type),
    R("importance_sampling_level", "loss.policy_loss", "token",
      ", ".join(f"{k} -> {v}" for k, v in IS_LEVELS.items()) + " (the clipped losses)", _part_of("loss_type")),
    R("scale_rewards", "loss.adv_scale", "group", "group, batch or none (true = group, false = none)",
      _scale_rewards),
    R("multi_objective_aggregation", "loss.multi_objective_aggregation", "sum_then_normalize", "copied"),
    R("mask_truncated_completions", "loss.mask_truncated", False, "copied"),
    R("top_entropy_quantile", "loss.top_entropy_quantile", 1.0, "copied"),
    R("entropy_coef", "loss.entropy_coef", 0.0, "copied; the bonus is averaged as the loss is (loss.agg_mode), TRL's "
      "over the tokens: under a loss_type that is not a token mean (grpo, dr_grpo, sapo, luspo) a note says so",
      _entropy_coef, copies="loss.entropy_coef"),
    R("use_adaptive_entropy", "loss.entropy_target", False, "true: loss.entropy_target = entropy_target; false: "
      "none", _adaptive_entropy),
    R("entropy_target", "loss.entropy_target", 0.2, "with use_adaptive_entropy (else TRL ignores it: a note)",
      _entropy_target),
    R("entropy_coef_delta", "loss.entropy_coef_delta", 0.005, "copied"),
    R("entropy_coef_min", "loss.entropy_coef_min", 0.0, "copied"),
    R("entropy_coef_max", "loss.entropy_coef_max", 1.0, "copied"),
    R("sapo_temperature_pos", "loss.params.sapo_temperature_pos", 1.0, "copied under loss_type sapo",
      _loss_param("sapo")),
    R("sapo_temperature_neg", "loss.params.sapo_temperature_neg", 1.05, "copied under loss_type sapo",
      _loss_param("sapo")),
    R("vespo_k_pos", "loss.params.vespo_k_pos", 2.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("vespo_lambda_pos", "loss.params.vespo_lambda_pos", 3.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("vespo_k_neg", "loss.params.vespo_k_neg", 3.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("vespo_lambda_neg", "loss.params.vespo_lambda_neg", 2.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("delta", "", None, "unset only", _only(None, "two-sided clipping of the ratio is not implemented; "
                                                 "loss.dual_clip is verl's dual clip, a different rule")),
    R("reward_weights", "rewards.<task> weights", None, "weigh the reward functions, in order: a TRL command "
      "line's reward_model_name_or_path and reward_funcs (GRPOScriptArguments), or each task's list of "
      "train(rewards=...)", _part_of("")),
    # --- generation
    R("max_completion_length", "rollout.max_new_tokens, rollout.max_trajectory_tokens", 512, "copied into both: a "
      "reply's length, and with tools the whole trajectory's (replies, tool results and template text), as in TRL",
      _completion_length, copies="rollout.max_new_tokens"),
    R("max_tool_calling_iterations", "rollout.max_tool_turns", None, "copied: the rounds of tool calls a trajectory "
      "may run (TRL's loop runs a reply's calls and samples the next reply at most this many times; a reply that "
      "calls after the last round ends the trajectory, its calls not run, as in TRL); unset (TRL: no limit, the "
      "trajectory's length ends it): max_completion_length rounds, so the trajectory budget ends it first",
      _tool_turns),
    R("temperature", "rollout.temperature", 1.0, "copied"),
    R("top_p", "rollout.top_p", 1.0, "copied"),
    R("top_k", "rollout.top_k", 0, "copied (0 and unset: off)", _none_is("rollout.top_k", 0), copies="rollout.top_k"),
    R("min_p", "rollout.min_p", None, "copied (unset: 0, off)", _none_is("rollout.min_p", 0.0), copies="rollout.min_p"),
    R("repetition_penalty", "rollout.repetition_penalty", 1.0, "copied"),
    R("cache_implementation", "rollout.cache_implementation", None, "copied (unset: dynamic)",
      _none_is("rollout.cache_implementation", "dynamic")),
    R("generation_kwargs", "", None, "unset only", _only(None, "set the rollout.* fields instead")),
    R("chat_template_kwargs", "", None, "unset only", _only(None, "the tokenizer's chat template is applied as it is")),
    # --- the model and the machine
    R("bf16", "model.dtype", None, "unset or true (TRL: true unless fp16): bfloat16 weights on a GPU; on the CPU "
      "float32 (grpo-dual does not switch bf16 on there; a note when bf16 is set true); false: float32", _precision),
    R("fp16", "model.dtype", False, "true: float16 (with a gradient scaler)", _part_of("bf16")),
    R("use_cpu", "train.device", False, "true: cpu; false: auto", _device),
    R("gradient_checkpointing", "model.gradient_checkpointing", True, "copied (TRL's default is on)"),
    R("torch_compile", "model.compile", False, "copied"),
    R("trust_remote_code", "model.trust_remote_code", False, "copied"),
    R("model_init_kwargs", "model.dtype, model.attn_implementation", None, "its dtype (or torch_dtype): the "
      "weights' dtype (over bf16's); its attn_implementation; any other key is refused", _model_init),
    R("disable_dropout", "", False, "named in a note when true",
      _noted("grpo-dual's rollouts and log-prob passes always run without dropout; the training forward keeps the "
             "model's (for LoRA: model.lora_dropout)")),
    # --- where it writes, what it logs
    R("output_dir", "checkpoint.final_model_dir, train.output_dir, train.run_name", None, "the folder TRL writes "
      "into (unset: trainer_output): the final model (or LoRA adapter) and its tokenizer at its top, loadable with "
      "from_pretrained(output_dir) as after TRL's trainer.save_model(); grpo-dual's run folder (config.json, "
      f"metrics, checkpoints, evaluations, report) inside it, {TRL_RUN_FOLDER}/", _output_dir),
    R("run_name", "", None, "named in a note when set", _noted("the W&B run is named after the run folder")),
    R("logging_strategy", "train.log_every", "steps", "steps only", _logging),
    R("logging_steps", "train.log_every", 10, "a console line every logging_steps optimizer steps "
      "(metrics.jsonl gets every step)", _part_of("logging_strategy")),
    R("log_completions", "train.sample_every", False, "true: the step's completions to samples/ every "
      "logging_steps; false: train.sample_every=0", _part_of("logging_strategy")),
    R("num_completions_to_print", "", None, "named in a note when set",
      _noted("samples/ holds every completion of a logged step; none are printed")),
    R("save_strategy", "checkpoint.every, checkpoint.every_epoch", "steps", "steps: a checkpoint every save_steps "
      "optimizer steps (also as output_dir/checkpoint-N); epoch: at the end of each epoch (checkpoint.every_epoch: "
      "every = an epoch's RL steps, once the "
      "rows are loaded); no: checkpoint.every=0 (the final checkpoint is still written)", _saving),
    R("save_steps", "checkpoint.every", 500, "see save_strategy", _part_of("save_strategy")),
    R("save_total_limit", "checkpoint.keep_last", None, "checkpoints kept, checkpoint-N folders too (unset: all, "
      "keep_last=0)",
      _part_of("save_strategy")),
    R("eval_strategy", "train.eval_every, train.eval_every_epoch", "no", "steps: a held-out evaluation every "
      "eval_steps optimizer steps (unset: logging_steps); epoch: at the end of each epoch (train.eval_every_epoch: "
      "eval_every = an epoch's RL steps, once the rows are loaded); no: train.eval_every=0 (grpo-dual still evaluates "
      "before and after training)", _evaluating),
    R("eval_steps", "train.eval_every", None, "see eval_strategy", _part_of("eval_strategy")),
    R("load_best_model_at_end", "checkpoint.keep_best", False, "the final model (output_dir, final/) is the best "
      "held-out evaluation's by metric_for_best_model, not the last step's, with transformers' rules: an eval_strategy "
      "other than no, save_strategy the same, save_steps a multiple of eval_steps (refused by name otherwise); the "
      "best's weights kept in the run folder's best/", _best_model, copies="checkpoint.keep_best"),
    R("metric_for_best_model", "train.best_metric", None, "reward or eval_reward: the mean held-out reward; unset, "
      "and transformers' default under load_best_model_at_end (the eval loss, which grpo-dual's greedy evaluation "
      "has none of: a note), reward; another metric is refused", _part_of("load_best_model_at_end")),
    R("greater_is_better", "train.greater_is_better", None, "copied (unset: true, as transformers derives it for a "
      "metric that does not end in loss)", _part_of("load_best_model_at_end")),
    R("per_device_eval_batch_size", "", 8, "named in a note when set",
      _noted("grpo-dual's held-out evaluation is greedy, one completion per prompt, data.eval_size prompts")),
    R("num_generations_eval", "", None, "named in a note when set",
      _noted("grpo-dual's held-out evaluation is greedy, one completion per prompt")),
    R("report_to", "train.tensorboard, train.wandb_project", "none", "tensorboard and wandb (none: neither)",
      _report_to),
    R("project", "train.wandb_project", "huggingface", "the W&B project under report_to wandb",
      _part_of("report_to")),
)
"""Every GRPOConfig field grpo-dual reads, in the order of docs/TRL.md. Any other field must keep TRL's default."""

ROWS = {row.trl: row for row in TABLE}
DEFAULTS = {row.trl: row.default for row in TABLE}
"""TRL 1.16's defaults of TABLE's fields: what a config file or dict that leaves one out gets."""
INSTEAD = {"resume_from_checkpoint": "grpo-dual resumes with --resume (checkpoint.resume), on TRL's command line "
                                     "too: --resume auto (the newest complete checkpoint of output_dir's run folder, "
                                     f"output_dir/{TRL_RUN_FOLDER}) or --resume PATH (a checkpoint folder); drop "
                                     "resume_from_checkpoint"}
"""GRPOConfig fields outside TABLE that grpo-dual does by another setting: refused with it."""
HANDLED_ELSEWHERE = {"reward_weights"}
"""Translated by the caller: the weights go with the reward functions (`train(rewards=...)`)."""
bind(TABLE, "GRPOConfig")  # the rules that need their own name, default and record
