"""A TRL GRPOConfig on a tiny model: its epochs, schedule, checkpoints, logging and batch shape as a run
does them (a group spanning micro-batches makes the same optimizer step as the whole batch; the scheduler resumes
bit-identically), and TRL's output_dir holds the final model (as trainer.save_model leaves it) and the run folder."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import pytest
import torch

from grpo import config as C
from grpo.run.trl.translation import translate

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

trl = pytest.importorskip("trl")
ROWS = [{"prompt": f"Write the word number {i} in capitals."} for i in range(24)]
SMALL = ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2", "sft.steps=0", "data.eval_size=2"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


def grpo_config(tmp_path, **fields):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_completion_length=4,
                              **{"gradient_checkpointing": False, **fields})


def test_a_group_spanning_micro_batches_makes_the_whole_batchs_optimizer_step():
    """per_device_train_batch_size=4, num_generations=8, gradient_accumulation_steps=2 (TRL accepts it): one prompt's
    8 completions a step, trained 4 at a time; the update equals the one on all 8 at once."""
    from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
    from grpo.phases.update import Learner, StepSettings, update_passes
    from tests.test_micro_batches import CORPUS, make_batch

    cfg = C.from_dict(C.config_tree("custom", [], translate(
        {"per_device_train_batch_size": 4, "num_generations": 8, "gradient_accumulation_steps": 2,
         "max_steps": 1, "use_cpu": True}).tree))
    assert (cfg.prompts_per_step, cfg.seqs_per_step, cfg.micro_batch_seqs) == (1, 8, 4)
    tok = build_tiny_tokenizer(CORPUS, vocab_size=300)
    model = build_tiny_model(tok, seed=1, hidden=64, layers=2, heads=4, kv_heads=2).eval()
    batch = make_batch()  # 8 completions: one group of K 8
    assert batch.size == cfg.seqs_per_step
    after = {}
    for size in (cfg.micro_batch_seqs, batch.size):
        m = copy.deepcopy(model)
        params = [p for p in m.parameters() if p.requires_grad]
        update_passes(Learner(m, torch.optim.SGD(params, lr=1.0), params), copy.copy(batch), torch.tensor([0.0, 0.0]),
                   cfg.loss, ["a", "b"], StepSettings(micro_batch_seqs=size, temperature=1.0, max_grad_norm=1e9,
                                                      skip_grad_norm=1e9))
        after[size] = params
    for a, b in zip(after[4], after[8], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(after[4], model.parameters(), strict=True)) > 1e-5


def test_a_trl_config_trains_its_epochs_schedule_checkpoints_and_logging_into_output_dir(tmp_path):
    from transformers import get_scheduler

    import grpo_train

    args = grpo_config(tmp_path, num_train_epochs=2, per_device_train_batch_size=4, num_generations=4,
                       gradient_accumulation_steps=2, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2,
                       save_steps=4, logging_steps=2, log_completions=True, eval_strategy="steps", eval_steps=6)
    seen = []

    def curriculum(completions, trainer_state, log_metric, **kwargs):  # TRL passes these: not refused
        seen.append((type(trainer_state).__name__, trainer_state.global_step, trainer_state.max_steps))
        log_metric("curriculum_step", float(trainer_state.global_step))
        return [0.0] * len(completions)

    from grpo.grading.graders import set_trainer_state

    set_trainer_state(5, 4)  # what an earlier run in this process left: a new run must not show it to its rewards
    run = grpo_train.train(SMALL, tasks={"caps": ROWS[:20]}, rewards={"caps": [reward_len, curriculum]}, args=args,
                           eval_dataset=ROWS[20:])  # TRL evaluates an eval_dataset; every training row trains
    # 20 rows, 2 prompts a step, 2 epochs
    n_train = len(run.samples.training["caps"])
    assert n_train == 20
    steps = 2 * (n_train // 2)
    # the run folder, inside output_dir
    assert run.progress.step == steps and run.run_dir == tmp_path / "out" / "grpo-dual"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # output_dir: the final model, as TRL leaves it
    assert AutoTokenizer.from_pretrained(tmp_path / "out").vocab_size == run.tokenizer.vocab_size
    for (name, a), (_, b) in zip(run.policy.model.named_parameters(), saved.named_parameters(), strict=True):
        assert torch.equal(a.detach(), b), name
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["lr"] for r in rows if "lr" in r}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=steps)
    trl_lrs = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        trl_lrs.append(optimizer.param_groups[0]["lr"])  # the lr of the next step, as our "lr" after step s
    assert [logged[s] for s in range(1, steps + 1)] == pytest.approx(trl_lrs, abs=1e-12)
    kept = sorted(p.name for p in (run.run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert [int(n.split("_")[1]) for n in kept] == [s for s in range(1, steps + 1) if s % 4 == 0 or s == steps]
    sampled = sorted(int(p.stem.split("_")[-1]) for p in (run.run_dir / "samples").glob("*.jsonl"))
    assert sampled == [s for s in range(1, steps + 1) if s % 2 == 0]
    assert {f"step_{s}" for s in range(6, steps, 6)} <= set(run.progress.evals)
    assert {name for name, _, _ in seen} == {"TrainerState"} and {total for _, _, total in seen} <= {0, steps}
    assert {step for _, step, _ in seen} == set(range(steps))  # optimizer steps taken before each step's scoring
    assert [r["reward_log/curriculum_step"] for r in rows if "lr" in r] == [float(s) for s in range(steps)]


def test_save_and_eval_strategy_epoch_checkpoint_and_evaluate_at_each_epochs_end(tmp_path):
    """save_strategy="epoch" / eval_strategy="epoch" (honoured, not refused): a checkpoint and a held-out
    evaluation at the end of each pass over the training rows, the steps of an epoch counted once the rows are
    loaded (TRL's epoch: the training prompts // the prompts of a step)."""
    import grpo_train

    args = grpo_config(tmp_path, num_train_epochs=3, per_device_train_batch_size=4, num_generations=2,
                       save_strategy="epoch", eval_strategy="epoch", save_total_limit=None, learning_rate=1e-3)
    run = grpo_train.train(SMALL, tasks={"caps": ROWS[:10]}, rewards={"caps": [reward_len]}, args=args,
                           eval_dataset=ROWS[10:12])
    per_epoch = len(run.samples.training["caps"]) // 2
    assert per_epoch >= 2 and run.progress.step == 3 * per_epoch
    assert (run.cfg.checkpoint.every, run.cfg.train.eval_every) == (per_epoch, per_epoch)
    kept = sorted(int(p.name.split("_")[1]) for p in (run.run_dir / "checkpoints").iterdir()
                  if p.name.startswith("step_"))
    assert kept == [per_epoch, 2 * per_epoch, 3 * per_epoch]
    during = sorted(int(name.split("_")[1]) for name in run.progress.evals if name.startswith("step_"))
    assert during[:2] == [per_epoch, 2 * per_epoch] and set(during) <= {per_epoch, 2 * per_epoch, 3 * per_epoch}
    saved = json.loads((run.run_dir / "config.json").read_text())
    assert (saved["checkpoint"]["every"], saved["train"]["eval_every"]) == (per_epoch, per_epoch)


def test_the_learning_rate_schedule_resumes_bit_identically(tmp_path):
    """A cosine schedule with warm-up, a group spanning micro-batches (2 of K 4) and TRL's gradient checkpointing: 4
    steps in one go == 2 steps, then a resume from that checkpoint."""
    import grpo_train

    fields = dict(max_steps=4, per_device_train_batch_size=2, num_generations=4, gradient_accumulation_steps=2,
                  learning_rate=1e-3, lr_scheduler_type="cosine", warmup_steps=1, save_steps=2,
                  gradient_checkpointing=True)

    def start(folder):
        args = grpo_config(folder, **fields)
        return grpo_train.train(SMALL, tasks={"caps": ROWS}, rewards={"caps": [reward_len]}, args=args)

    full = start(tmp_path / "a")
    shutil.copytree(full.run_dir, tmp_path / "b" / "out" / "grpo-dual")
    for folder in (tmp_path / "b" / "out" / "grpo-dual" / "checkpoints").iterdir():
        if folder.name != "step_000002" and folder.is_dir():
            shutil.rmtree(folder)
    args = grpo_config(tmp_path / "b", **fields)
    resumed = grpo_train.train(SMALL, tasks={"caps": ROWS}, rewards={"caps": [reward_len]}, args=args,
                               checkpoint={"resume": "auto"})
    assert (full.cfg.micro_batch_seqs, full.cfg.seqs_per_step, full.cfg.model.gradient_checkpointing) == (2, 4, True)
    assert resumed.updater.scheduler.state_dict() == full.updater.scheduler.state_dict()
    for (name, a), (_, b) in zip(full.policy.model.named_parameters(), resumed.policy.model.named_parameters(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_prompts_are_handled_as_trl_handles_them(tmp_path):
    """Under a GRPOConfig a string prompt (TRL's standard form) is tokenized as it is, as TRL's
    GRPOTrainer._tokenize_prompts does (processing_class(text=prompts)); a list of messages goes through the chat
    template. Wrapping both in the chat template would change what a TRL user's string prompt says."""
    from grpo.models.modeling import build_tiny_tokenizer
    from grpo.models.tokens import encode_prompt
    from grpo.run.api import python_config
    from grpo.run.assembly.samples import load_samples

    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in ROWS]
    cfg, _ = python_config(None, {"plain": ROWS, "chat": chat}, {"plain": [reward_len], "chat": [reward_len]}, None,
                           {}, trl_args=grpo_config(tmp_path, max_steps=2))
    assert cfg.data.prompt_format == "trl"
    rows = load_samples(cfg.data, cfg.train.seed, cfg.tasks, announce=False)
    tok = build_tiny_tokenizer([r["prompt"] for r in ROWS])
    by_task = {s.task: s for s in rows.train}
    text = by_task["plain"].messages[-1]["content"]
    assert encode_prompt(tok, by_task["plain"].messages) == tok(text)["input_ids"]  # TRL: processing_class(text=...)
    messages = [dict(m) for m in by_task["chat"].messages]
    assert encode_prompt(tok, by_task["chat"].messages) == tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert encode_prompt(tok, by_task["chat"].messages) != tok(messages[-1]["content"])["input_ids"]
    plain_cfg, _ = python_config(None, {"plain": ROWS}, {"plain": [reward_len]}, None, {})
    assert plain_cfg.data.prompt_format == "chat"  # grpo-dual's own default is unchanged
