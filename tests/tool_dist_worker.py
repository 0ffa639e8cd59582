"""Run by tests/test_tool_distributed.py under `accelerate launch --num_processes 2 --cpu tests/tool_dist_worker.py
OUT`: per scenario, SFT and one RL step with a deterministic tool (tests/test_tool_rollouts.py's calculator) or a
deterministic environment that holds a lock (cannot be pickled); rank 0 saves the trainable weights and the step's
metrics. The same function builds the one-process reference in the test."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.dist_worker import dist_config, parameters  # noqa: E402
from tests.test_tool_environments import GuessingGame  # noqa: E402
from tests.trainer_helpers import call_text  # noqa: E402


class LockedGame(GuessingGame):
    """The guessing game holding what an environment may hold and pickle cannot copy (a lock)."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


SCENARIOS = {  # name -> (config overrides, the call a forced first reply makes)
    "tools": (["rollout.tools=tests.test_tool_rollouts:calculator", "rollout.max_tool_turns=2"],
              call_text("calculator", {"expression": "12*3"})),
    "environment": (["rollout.environment_factory=tests.tool_dist_worker:LockedGame", "rollout.max_tool_turns=2",
                     "rewards.hallucination=tests.test_tool_environments:solved_reward:1.0"],
                    call_text("guess", {"number": 5})),
}


def forcing(real: Callable[..., Any], call_text: str) -> Callable[..., Any]:
    """The engine's decode (`real(model, rollout, greedy)`: grpo.phases.tools.decoder), except that a first reply whose
    first sampled id is even becomes `call_text` (a random tiny model never writes a call): decided by the sampled ids
    alone, which per-completion sampling makes the same on any number of processes. `.tokenizer` must be set to the
    run's before the first rollout."""
    def forced(model, rows, rollout, stop_ids, pad_id, **kw):
        out, fixed = real(model, rollout, kw["greedy"])(model, rows, rollout, stop_ids, pad_id, **kw)
        tok = forced.tokenizer
        if not any(tok.decode(r).count("tool: ") for r in rows):  # the first turn (the tiny template's tool turns)
            call = tok(call_text, add_special_tokens=False)["input_ids"]
            out = [call + [stop_ids[0]] if o and o[0] % 2 == 0 else o for o in out]
        return out, fixed

    return forced


def tool_step(out_dir: Path, scenario: str, world: int, install: Callable[[Callable[..., Any]], None]) -> dict:
    """setup + SFT + one RL step of `scenario` on `world` processes (the same global batch on any); `install` puts
    the forcing decode in place of the engine grpo.phases.tools.decoder picks."""
    import grpo_train as G
    from grpo.phases import tools as T

    overrides, call = SCENARIOS[scenario]
    forced = forcing(T.decoder, call)
    install(forced)
    run = G.setup(dist_config(out_dir, scenario, world, f"train.run_name={scenario}", *overrides))
    forced.tokenizer = run.tokenizer
    G.sft_phase(run)
    metrics = G.rl_step(run, 1)
    trainable = {n for n, p in run.policy.model.named_parameters() if p.requires_grad}
    return {"weights": {n: w for n, w in parameters(run).items() if n in trainable}, "metrics": metrics,
            "is_main": run.dist.is_main, "dist": run.dist}


if __name__ == "__main__":
    from grpo.machine.distributed import relaunch_on_cpu, requested_cpu_processes
    from grpo.phases import tools as T

    n_processes = requested_cpu_processes()
    if n_processes > 1:
        relaunch_on_cpu(n_processes, sys.argv[0], sys.argv[1:])
    out, real = Path(sys.argv[1]), T.decoder
    for name in sys.argv[2:]:
        result = tool_step(out, name, 2, lambda fn: setattr(T, "decoder", lambda *a, **k: fn))
        T.decoder = real
        if result["is_main"]:
            torch.save(result["weights"], out / f"{name}.pt")
            (out / f"{name}.json").write_text(json.dumps(result["metrics"]))
    # Every result is written. A rank could still abort in the interpreter's teardown ("terminate called without an
    # active exception", SIGABRT: 3 runs of this test in about 20, each after both scenarios had written their
    # files), even after the barrier and destroy_process_group that grpo_train.main ends with (Dist.close, done here
    # too): the worker leaves without that teardown.
    result["dist"].close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
