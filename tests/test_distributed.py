"""Data parallelism (grpo/machine/distributed.py): a run on 2 CPU processes equals the 1-process run with the same
global batch. The 2-process side is `accelerate launch --num_processes 2 --cpu tests/dist_worker.py`, started once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo import config as C
from grpo.machine.distributed import Dist, check_strategy, num_processes_from_launch
from tests.dist_worker import SCENARIOS, one_step

ROOT = Path(__file__).resolve().parents[1]
LR = 1e-4  # train.lr of dist_config: Adam's first step moves a weight by about lr


def accelerate_cli() -> list[str]:
    exe = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if exe is None:
        pytest.skip("the accelerate command is not installed")
    return [exe]


def two_process_runs(out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """The 2-process side into `out` (a one-machine launch rendezvouses on a port free at its start, so other
    launches, from other test workers, may run meanwhile)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [*accelerate_cli(), "launch", "--num_processes", "2", "--cpu", str(ROOT / "tests" / "dist_worker.py"),
           str(out), *SCENARIOS, "resume", "resume_fsdp"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900), out


@pytest.fixture(scope="module")
def two_process(tmp_path_factory) -> Path:
    proc, out = two_process_runs(tmp_path_factory.mktemp("two_process"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "starting 2 CPU processes" in proc.stderr  # the --cpu launcher alone would have started one
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "three_steps"])
def test_two_processes_equal_one_process(two_process, tmp_path, scenario):
    one = one_step(tmp_path, scenario, world=1)
    two = torch.load(two_process / f"{scenario}.pt")
    m1, m2 = one["metrics"], json.loads((two_process / f"{scenario}.json").read_text())
    # the same rollouts: sharded prompts, per-completion sampling streams
    completions = (4 if scenario.endswith("_ga") else 2) * 2 * 4  # micro-batches x prompts x K, all processes
    if scenario == "split":  # train.split_groups: 3 prompts x K 2 in all, prompt 1's group on both processes
        completions = 3 * 2
    assert m1["rollout/tokens"] == m2["rollout/tokens"] and m1["rollout/num"] == m2["rollout/num"] == completions
    for task in ("fairness", "hallucination"):
        assert m1[f"reward/{task}/mean"] == pytest.approx(m2[f"reward/{task}/mean"], abs=1e-12)
    # SFT sharded over the processes, then one RL optimizer step: the weights of the 1-process run
    assert max_diff(one["after_sft"], two["after_sft"]) <= 1e-5
    assert max_diff(one["weights"], two["weights"]) <= 1e-5
    assert max(((one["weights"][n] - one["after_sft"][n]).abs().max().item() for n in one["weights"])) >= 0.5 * LR
    # Adam's first step is nearly scale-free, so the gradient itself is compared through its norm: a mean over
    # ranks instead of a sum, or a per-rank token count, would change it
    assert m2["health/grad_norm"] == pytest.approx(m1["health/grad_norm"], rel=1e-5)
    # the on-policy loss is a sum of O(1) terms that cancels to ~1e-7 (zero-mean advantages): fp32 rounding of sums
    # taken in another order (each process groups its own rows into micro-batches by length) moves it by ~3e-9
    assert m2["loss/total"] == pytest.approx(m1["loss/total"], rel=1e-4, abs=1e-8)
    for key in (k for k in m1 if k.startswith(("kl/", "entropy/"))):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-8), key


def test_later_steps_stay_equal(two_process, tmp_path):
    """A failure at step 2 is invisible at step 1: three steps with an adaptive β. Rollouts (discrete) must be the
    same at every step, β must move identically, and the weights stay within Adam's float noise."""
    one = one_step(tmp_path, "three_steps", world=1)
    two_history = json.loads((two_process / "three_steps.history.json").read_text())
    assert len(one["history"]) == len(two_history) == 3
    for m1, m2 in zip(one["history"], two_history, strict=True):
        assert m1["rollout/tokens"] == m2["rollout/tokens"]
        for task in ("fairness", "hallucination"):
            assert m1[f"reward/{task}/mean"] == pytest.approx(m2[f"reward/{task}/mean"], abs=1e-12)
            assert m1[f"beta/{task}"] == pytest.approx(m2[f"beta/{task}"], rel=1e-5)
    assert one["history"][-1]["beta/fairness"] != one["history"][0]["beta/fairness"]  # β really moved
    assert max_diff(one["weights"], torch.load(two_process / "three_steps.pt")["weights"]) <= 1e-4


def test_pcgrad_combines_the_global_task_gradients(two_process, tmp_path):
    """Per-task gradients are summed over ranks BEFORE the projection: same conflict, same projection."""
    one = one_step(tmp_path, "pcgrad", world=1)["metrics"]
    two = json.loads((two_process / "pcgrad.json").read_text())
    assert one["multi/cos_min"] < 0 and one["multi/pcgrad/projections"] > 0  # the surgery really acted
    assert two["multi/pcgrad/projections"] == one["multi/pcgrad/projections"]
    assert two["multi/cos_min"] == pytest.approx(one["multi/cos_min"], rel=1e-4)


@pytest.mark.parametrize("scenario", ["resume", "resume_fsdp"])
def test_resume_from_a_two_process_checkpoint_is_exact(two_process, scenario):
    weights = torch.load(two_process / f"{scenario}.pt")
    assert max_diff(weights["straight"], weights["resumed"]) == 0.0
    folder = two_process / "cut" / scenario / "checkpoints"
    from grpo.run.checkpoint import files as ckpt

    state, _ = ckpt.load(next(folder.glob("step_*")))
    assert len(state["rng_ranks"]) == 2  # every rank's RNG state
    assert not any(hasattr(w, "to_local") for w in state["weights"].values())  # whole tensors, not shards
    from transformers import AutoModelForCausalLM  # the final model is whole too, loadable without the trainer

    final = AutoModelForCausalLM.from_pretrained(two_process / "cut" / scenario / "final").state_dict()
    assert max_diff({n: final[n] for n in weights["resumed"]}, weights["resumed"]) == 0.0


def test_metrics_are_written_once(two_process):
    rows = [json.loads(line)
            for line in (two_process / "straight" / "resume" / "metrics.jsonl").read_text().splitlines()]
    rl_steps = [r["step"] for r in rows if "loss/total" in r]
    assert rl_steps == [1, 2, 3]
    assert all(r["rollout/num"] == 16.0 for r in rows if "rollout/num" in r)  # the global batch, not a share


def test_one_process_collectives_are_the_identity():
    d = Dist()
    t = torch.tensor([1.0, 2.0])
    assert d.world == 1 and d.is_main and not d.active
    assert d.sum(t) is t and t.tolist() == [1.0, 2.0]
    assert d.gather({"a": 1}) == [{"a": 1}] and d.broadcast(3) == 3 and d.any(True) and not d.any(False)
    assert d.share(6) == slice(0, 6)
    model, opt = torch.nn.Linear(2, 2), None
    assert d.prepare(model, opt) == (model, opt) and d.unwrap(model) is model


def test_a_finished_command_line_run_destroys_the_process_group_after_a_barrier(monkeypatch, tmp_path):
    # a rank that leaves without destroy_process_group can abort at exit ("terminate called without an active
    # exception", SIGABRT: seen once in test_two_processes_stop_together_and_restore_on_every_rank under load)
    import grpo_train as G
    from grpo.run.record import Progress

    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: calls.append("destroy"))
    Dist().close()
    assert calls == []  # one process: nothing to close
    two = Dist()
    two.world = 2
    two.close()
    assert calls == ["barrier", "destroy"]

    class FakeRun:
        dist, run_dir = two, tmp_path
        progress = Progress()

    calls.clear()
    monkeypatch.setattr(G, "setup", lambda cfg: FakeRun())
    monkeypatch.setattr(G, "main", lambda cfg, run: run)
    assert G.cli(["--output-dir", str(tmp_path)]) == 0
    assert calls == ["barrier", "destroy"]  # after the run, on every rank

    def fails(cfg, run):
        from grpo.core.weight_guard import TrainingUnstable

        raise TrainingUnstable("weights went non-finite")

    calls.clear()
    monkeypatch.setattr(G, "main", fails)
    assert G.cli(["--output-dir", str(tmp_path)]) == 1
    assert calls == []  # after a failure other ranks may sit in a collective: no clean-up that would hang


def test_a_split_group_gives_each_process_the_rows_trl_gives_it():
    """train.split_groups: a process's completions are its contiguous share of the step's prompt-major rows, the rows
    TRL's RepeatSampler (each prompt repeated num_generations times in a row) yields for it when each process takes
    per_device_train_batch_size of them in turn; an uneven split is refused."""
    from trl.trainer.grpo_trainer import RepeatSampler

    from grpo.run.step_owners import completion_share

    for n_prompts, k, world in ((1, 4, 2), (3, 2, 2), (3, 4, 4), (2, 8, 4)):
        per_device = n_prompts * k // world  # gradient_accumulation_steps 1: one micro-batch a process
        trl = list(RepeatSampler(range(50), mini_repeat_count=k, batch_size=n_prompts, shuffle=False))[:n_prompts * k]
        for rank in range(world):
            ours = [row // k for row in completion_share(n_prompts, k, world, rank)]
            assert ours == trl[rank * per_device:(rank + 1) * per_device]
    with pytest.raises(ValueError, match="evenly over 4 processes"):
        completion_share(3, 2, 4, 0)


def test_split_groups_is_checked_before_the_model_loads_and_trl_maps_onto_it(tmp_path):
    """An uneven split, or a shared prompt forward forced on, is a ConfigError naming the field; TRL's batch of
    per_device_train_batch_size 2 x 2 processes with num_generations 4 (one group over both processes) is
    train.split_groups, and on one process it is still refused (as TRL refuses it), naming what to set."""
    from trl import GRPOConfig

    from grpo.run.step_owners import prompt_copies
    from grpo.run.trl.translation import translate
    from tests.trainer_helpers import fast_config

    split = fast_config(tmp_path, "train.split_groups=true", "train.prompts_per_micro_step=3", "rollout.k=2")
    assert prompt_copies(split, 1) == 1 and prompt_copies(split, 2) == 1 and prompt_copies(split, 3) == 1
    assert prompt_copies(fast_config(tmp_path), 2) == 2  # off: each process draws its own prompts
    with pytest.raises(C.ConfigError, match="evenly over 4 processes") as err:
        prompt_copies(split, 4)
    assert err.value.field == "train.split_groups"
    forced = fast_config(tmp_path, "train.split_groups=true", "model.shared_prompt_forward=on")
    with pytest.raises(C.ConfigError) as err:
        prompt_copies(forced, 2)
    assert err.value.field == "model.shared_prompt_forward"

    class TwoProcesses(GRPOConfig):
        world_size = property(lambda self: 2)  # what accelerate's state says under `accelerate launch` with 2

    fields = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=1,
                  num_generations=4, use_cpu=True)
    tree = translate(TwoProcesses(**fields)).tree
    assert tree["train"]["split_groups"] is True
    assert ((tree["train"]["prompts_per_micro_step"], tree["train"]["grad_accum"], tree["train"]["micro_batch_size"])
            == (1, 1, 2))  # one prompt in all, each process trains its 2 completions
    with pytest.raises(C.ConfigError, match="not a multiple of num_generations=4"):  # (TRL's own object refuses it)
        translate({k: v for k, v in fields.items() if k != "output_dir"})


def test_share_refuses_an_uneven_split():
    d = Dist()
    d.world, d.rank = 2, 1
    assert d.share(6) == slice(3, 6)
    with pytest.raises(ValueError, match="evenly over 2 processes"):
        d.share(5)


def test_the_cpu_launch_command_line_is_read():
    assert num_processes_from_launch(["/v/bin/python", "/v/bin/accelerate", "launch", "--num_processes", "2",
                                      "--cpu", "grpo_train.py"]) == 2
    assert num_processes_from_launch(["accelerate", "launch", "--num_processes=4", "x.py"]) == 4
    assert num_processes_from_launch(["python", "x.py", "--num_processes", "2"]) == 0  # not a launcher
    assert num_processes_from_launch(["accelerate", "launch", "x.py"]) == 0


def test_deepspeed_is_refused_by_name():
    for ok in ("NO", "MULTI_GPU", "MULTI_CPU", "FSDP", "DistributedType.MULTI_GPU", "DistributedType.FSDP"):
        check_strategy(ok)
    for name in ("DEEPSPEED", "DistributedType.DEEPSPEED", "MEGATRON_LM"):
        with pytest.raises(ValueError, match="is not supported yet.*fsdp.yaml"):
            check_strategy(name)


def test_fsdp_refuses_what_it_does_not_support(tmp_path):
    import grpo_train as T
    from grpo import config as C
    from tests.trainer_helpers import fast_config

    dist = Dist()
    dist.world, dist.sharded = 2, True
    cfg = fast_config(tmp_path, "model.lora=true", "multi.combine=pcgrad", "sft.steps=2", "sft.batch_size=3")
    run = T.setup(fast_config(tmp_path))
    with pytest.raises(C.ConfigError, match="LoRA.*multi.combine=sum.*sft.batch_size"):
        T.assembly.check_sharding(cfg, run.policy, dist)
    with pytest.raises(ValueError, match="needs several processes"):
        T.setup(fast_config(tmp_path, "train.sharding=fsdp"))


def test_accelerate_configs_parse_and_name_their_strategy():
    import yaml

    folder = ROOT / "configs" / "accelerate"
    kinds = {p.stem: yaml.safe_load(p.read_text())["distributed_type"] for p in folder.glob("*.yaml")}
    assert kinds == {"single_gpu": "NO", "multi_gpu": "MULTI_GPU", "cpu_2proc": "MULTI_GPU", "fsdp": "FSDP",
                     "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED"}
    fsdp = yaml.safe_load((folder / "fsdp.yaml").read_text())["fsdp_config"]
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP" and fsdp["fsdp_reshard_after_forward"]


def test_sigterm_stops_every_rank_after_the_same_step_and_the_run_resumes(tmp_path):
    """SIGTERM to the launcher reaches the ranks at slightly different moments; the stop request is OR-ed over ranks
    each step, so all finish the same step, rank 0 writes the checkpoint, nobody hangs in a collective."""
    import signal
    import time

    from grpo.run.checkpoint import files as ckpt

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["grpo_train.py", "--preset", "demo", "--device", "cpu", "--output-dir", str(tmp_path), "--run-name", "r",
            "--set", "sft.steps=0", "--set", "train.eval_every=0", "--set", "data.eval_size=4"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.Popen([*launch, *args, "--max-steps", "500"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics, start = tmp_path / "r" / "metrics.jsonl", time.time()
    while time.time() - start < 300 and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count('"loss/total"') >= 2:
            break
        time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)  # a rank stuck in a collective would hang here
    assert "interrupted: checkpoint" in out, out[-3000:]
    folder = ckpt.find_resumable(tmp_path / "r")
    assert folder is not None
    step = int(folder.name.split("_")[-1])
    resumed = subprocess.run([*launch, *args, "--max-steps", str(step + 1), "--resume", "auto"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss/total"' in line]
    assert steps == list(range(1, step + 2))  # every step once, none lost, none repeated


def test_the_readme_accelerate_command_runs(tmp_path):
    """The README's 2-CPU-process command, as written (plus an output folder), trains 5 steps and finishes."""
    import shlex

    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("accelerate launch --num_processes 2 --cpu"))
    argv = shlex.split(line.split("#")[0])
    cmd = [*accelerate_cli(), *argv[1:], "--output-dir", str(tmp_path), "--run-name", "readme"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "starting 2 CPU processes" in proc.stderr and "x 2 processes" in proc.stdout
    rows = [json.loads(x) for x in (tmp_path / "readme" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/total" in r] == [1, 2, 3, 4, 5]
    assert (tmp_path / "readme" / "final").is_dir() and (tmp_path / "readme" / "report.json").exists()
