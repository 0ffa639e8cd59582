"""Task-balanced prompt batches, sampled without replacement per epoch, with a resumable position.

Each task keeps its own shuffled order (a permutation drawn from `seed` and the task's epoch number, so the state
is just counters). Tasks share the prompts of a step by smooth weighted round-robin: each slot goes to the task
with the most accumulated credit, so a mix of {a: 1, b: 1} gives a, b, a, b ... and odd batch sizes alternate.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from grpo.config import field_error
from grpo.core.step_types import Sample
from grpo.data.bbq import for_epoch


def check_prompts_per_step(samples_by_task: Mapping[str, Sequence[Sample]], prompts_per_micro_step: int,
                           grad_accum: int, world: int = 1) -> None:
    """ConfigError naming train.prompts_per_micro_step when one RL step would draw more prompts (prompts_per_micro_step
    x grad_accum on each of `world` processes) than all tasks hold training rows together. The sampler would go
    round its epochs inside the step without a word, drawing every prompt many times over, and generate all those
    groups in one batched call: with 100000 prompts from a few hundred rows the step never ends. Checked once the
    rows are loaded, before the model."""
    rows = sum(len(s) for s in samples_by_task.values())
    drawn = prompts_per_micro_step * grad_accum * world
    if drawn > rows:
        on = f" on each of {world} processes" if world > 1 else ""
        most = max(1, rows // (grad_accum * world))
        if prompts_per_micro_step * world <= rows:  # a micro-step's prompts fit: the accumulation is what draws more
            raise field_error("train.grad_accum", grad_accum, f"one RL step draws train.prompts_per_micro_step x "
                              f"train.grad_accum = {prompts_per_micro_step * grad_accum} prompts{on}, more than the "
                              f"{rows} training rows of the tasks together: each step would repeat its prompts; use "
                              f"at most {max(1, rows // (prompts_per_micro_step * world))} train.grad_accum, or add "
                              f"rows")
        raise field_error("train.prompts_per_micro_step", prompts_per_micro_step,
                          f"one RL step draws train.prompts_per_micro_step x train.grad_accum = "
                          f"{prompts_per_micro_step * grad_accum} prompts{on}, more than the {rows} training rows of "
                          f"the tasks together ({', '.join(f'{t}: {len(s)}' for t, s in samples_by_task.items())}): "
                          f"each step would repeat its prompts; use at most {most} (or fewer train.grad_accum), or "
                          "add rows")


class TaskBalancedSampler:
    def __init__(self, samples_by_task: dict[str, list[Sample]], seed: int, mix: dict[str, float] | None = None):
        empty = [t for t, s in samples_by_task.items() if not s]
        if empty:
            raise ValueError(f"task(s) {empty} have no training samples: check the data source and split")
        self.samples = samples_by_task
        self.tasks = sorted(samples_by_task)
        weights = mix or {t: 1.0 for t in self.tasks}
        missing = [t for t in self.tasks if t not in weights]
        if missing or any(w <= 0 for w in weights.values()):
            raise ValueError(f"task mix {weights} must give a positive weight to every task {self.tasks}")
        total = sum(weights[t] for t in self.tasks)
        self.weights = {t: weights[t] / total for t in self.tasks}
        self.seed = seed
        self.epoch = {t: 0 for t in self.tasks}
        self.pos = {t: 0 for t in self.tasks}
        self.credit = {t: 0.0 for t in self.tasks}
        self._orders: dict[str, list[int]] = {}

    def _order(self, task: str) -> list[int]:
        key = f"{task}:{self.epoch[task]}"
        if key not in self._orders:
            order = list(range(len(self.samples[task])))
            random.Random(f"{self.seed}:{key}").shuffle(order)
            self._orders = {k: v for k, v in self._orders.items() if not k.startswith(f"{task}:")}
            self._orders[key] = order
        return self._orders[key]

    def _draw(self, task: str) -> Sample:
        if self.pos[task] >= len(self.samples[task]):
            self.epoch[task] += 1
            self.pos[task] = 0
        sample = self.samples[task][self._order(task)[self.pos[task]]]
        self.pos[task] += 1
        return for_epoch(sample, self.epoch[task])  # BBQ rows loaded with shuffled options: this epoch's order

    def next_batch(self, n_prompts: int) -> list[Sample]:
        """`n_prompts` samples, tasks mixed by weight."""
        out = []
        for _ in range(n_prompts):
            for t in self.tasks:
                self.credit[t] += self.weights[t]
            task = max(self.tasks, key=lambda t: (self.credit[t], -self.tasks.index(t)))
            self.credit[task] -= 1.0
            out.append(self._draw(task))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": dict(self.epoch), "pos": dict(self.pos), "credit": dict(self.credit), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state["epoch"]) != set(self.tasks):
            raise ValueError(f"sampler state has tasks {sorted(state['epoch'])}, this run has {self.tasks}")
        self.epoch, self.pos = dict(state["epoch"]), dict(state["pos"])
        self.credit, self.seed = dict(state["credit"]), state["seed"]
        self._orders = {}
