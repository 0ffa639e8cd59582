"""Run by tests/test_distributed.py under `accelerate launch --num_processes N --cpu tests/dist_worker.py OUT
SCENARIO...`: one optimizer step (or a short run) per scenario; rank 0 saves the trainable weights and metrics.

Each scenario is a list of config overrides on top of `dist_config`; the same function builds the one-process
reference runs in the test itself, so both sides share every setting except the process count and grad_accum.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo import config as C  # noqa: E402
from tests.trainer_helpers import fast_config  # noqa: E402

SCENARIOS: dict[str, list[str]] = {
    "token_mean": ["loss.agg_mode=token-mean"],
    "token_mean_ga": ["loss.agg_mode=token-mean"],
    "mu2": ["loss.agg_mode=token-mean", "loss.mu=2"],  # two optimizer steps on one rollout batch
    "seq_mean": ["loss.agg_mode=seq-mean-token-mean"],
    "seq_mean_ga": ["loss.agg_mode=seq-mean-token-mean"],
    # LoRA (SFT merged into the base, a fresh adapter, DDP prepared again) with activation checkpointing; LoRA dropout
    # off, since dropout masks come from each process's own RNG (with dropout the runs agree only in distribution)
    "lora": ["model.lora=true", "model.lora_r=4", "model.lora_dropout=0", "model.gradient_checkpointing=true"],
    # FSDP2: model and reference sharded over the processes (the 1-process side runs unsharded)
    "fsdp": ["train.sharding=fsdp"],
    "fsdp_ga": ["train.sharding=fsdp", "loss.agg_mode=seq-mean-token-mean", "loss.mu=2"],
    # several steps with a β that moves: rollouts, β and weights must stay in step after step 1
    "three_steps": ["kl.default.controller=adaptive", "kl.default.target=0.0001", "kl.default.horizon=2"],
    # each prompt encoded once for its K completions: the prompt forward outside the DDP wrapper, the completions in
    "shared": ["model.shared_prompt_forward=on"],
    "shared_ga": ["model.shared_prompt_forward=on", "loss.agg_mode=seq-mean-token-mean"],
    # opposed rewards, and a seed whose draws make the task gradients conflict (cos −0.06): the surgery must act
    "pcgrad": ["multi.combine=pcgrad", "multi.switch=always", "train.seed=3",
               "rewards.hallucination=tests.dist_worker:short_reward:1.0"],
    # a group spanning processes (train.split_groups): 3 prompts x K 2 = 6 completions in all, 3 a process, so prompt
    # 1's two completions are generated, scored and trained one on each process
    "split": ["train.split_groups=true", "train.prompts_per_micro_step=3", "train.grad_accum=1", "rollout.k=2"],
}
"""Scenarios whose name ends in _ga use gradient accumulation on every process (2 micro-batches per process)."""


def short_reward(completion: str, gold: dict) -> float:
    """The opposite of length_reward: shorter completions score higher."""
    return 1.0 - min(len(completion), 24) / 24.0


def dist_config(out_dir, scenario: str, world: int, *extra: str) -> C.Config:
    """The config of `scenario` for a run on `world` processes with the same GLOBAL batch as every other world:
    2 prompts per micro-step and 2 micro-batches in all (4 for the _ga scenarios), split over the processes."""
    total_micro = 4 if scenario.endswith("_ga") else 2
    if total_micro % world:
        raise ValueError(f"{scenario}: {total_micro} micro-batches cannot be split over {world} processes")
    overrides = [o for o in SCENARIOS.get(scenario, []) if world > 1 or not o.startswith("train.sharding")]
    return fast_config(out_dir, "train.device=cpu", "rollout.sampling_rng=per_completion", "train.lr=1e-4",
                       f"train.grad_accum={total_micro // world}", "kl.default.controller=fixed",
                       "kl.default.beta=0.05", "sft.steps=6", "sft.batch_size=6", "sft.lr=3e-3",
                       "rollout.max_new_tokens=10", *overrides, *extra)


def one_step(out_dir: Path, scenario: str, world: int) -> dict:
    """setup + SFT + one RL step (three for "three_steps"); returns {"weights", "after_sft", "metrics", "history"}
    (rank 0 writes them)."""
    import grpo_train as T

    cfg = dist_config(out_dir, scenario, world, f"train.run_name={scenario}")
    run = T.setup(cfg)
    T.sft_phase(run)  # SFT (sharded over processes too) teaches the stop token: completion lengths then vary
    after_sft = parameters(run)  # LoRA: the merged base too
    history = [T.rl_step(run, step) for step in range(1, 4 if scenario == "three_steps" else 2)]
    metrics = history[-1]
    trainable = {n for n, p in run.policy.model.named_parameters() if p.requires_grad}
    weights = {n: w for n, w in parameters(run).items() if n in trainable}
    return {"weights": weights, "after_sft": after_sft, "metrics": metrics, "history": history,
            "is_main": run.dist.is_main}


def parameters(run) -> dict[str, torch.Tensor]:
    """Every parameter of the policy, whole (gathered from the FSDP shards on rank 0 when sharded)."""
    if run.dist.sharded:
        names = {n for n, _ in run.policy.model.named_parameters()}
        return {n: w for n, w in run.dist.full_state(run.policy.model).items() if n in names}
    return {n: p.detach().clone() for n, p in run.policy.model.named_parameters()}


def main(out: str, scenarios: list[str]) -> None:
    import grpo_train as T

    out_dir = Path(out)
    for scenario in scenarios:
        if scenario in ("resume", "resume_fsdp"):  # 3 steps straight vs 2 steps, then resumed from the checkpoint
            base = ["train.max_steps=3", "checkpoint.every=1", "train.eval_every=0", "train.run_name=" + scenario,
                    *(["train.sharding=fsdp"] if scenario == "resume_fsdp" else [])]
            straight = T.main(dist_config(out_dir / "straight", "token_mean", 2, *base))
            T.main(dist_config(out_dir / "cut", "token_mean", 2, *base, "train.max_steps=2"))
            resumed = T.main(dist_config(out_dir / "cut", "token_mean", 2, *base, "checkpoint.resume=auto"))
            weights = {"straight": parameters(straight), "resumed": parameters(resumed)}
            if straight.dist.is_main:
                torch.save(weights, out_dir / f"{scenario}.pt")
            continue
        result = one_step(out_dir, scenario, 2)
        if result["is_main"]:
            torch.save({"weights": result["weights"], "after_sft": result["after_sft"]}, out_dir / f"{scenario}.pt")
            (out_dir / f"{scenario}.json").write_text(json.dumps(result["metrics"]))
            (out_dir / f"{scenario}.history.json").write_text(json.dumps(result["history"]))


if __name__ == "__main__":
    from grpo.machine.distributed import relaunch_on_cpu, requested_cpu_processes

    n_processes = requested_cpu_processes()  # reads the launcher's command line once
    if n_processes > 1:
        relaunch_on_cpu(n_processes, sys.argv[0], sys.argv[1:])
    main(sys.argv[1], sys.argv[2:])
