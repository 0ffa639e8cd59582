"""Figures the docs quote in prose that the code produces cheaply: preset values, the doctor's thresholds, code
constants, the demo model's size. (Tables of preset values and `field` (default X) are tests/test_docs.py's; the
estimator's figures tests/test_memory_doc.py's; the demo's results table tests/test_results_table.py's.)

Each claim is a piece of a doc with its figures in braces, e.g. "watches the last {10} RL steps", and one source per
figure (a function of the code); the doc must hold the piece with the braces removed (whitespace as in the doc is
collapsed to single spaces), and each figure must be its source's value written the doc's way. When a value changes,
the test names the doc, the stale figure and the new value.
"""

from __future__ import annotations

import re
from functools import cache

import pytest
from conftest import ROOT

from grpo import config as C
from grpo.core.kernels import DEFAULT_LOGPROB_CHUNK_ROWS
from grpo.machine.memory_estimate import DEFAULT_ALLOCATOR_SLACK, DEFAULT_CUDA_OVERHEAD_GB
from grpo.run.doctor import end_checks, window_checks
from grpo.run.doctor.thresholds import ONLINE_CODES, DoctorThresholds

TH = DoctorThresholds()
DOCS = {name: " ".join((ROOT / name).read_text().split())
        for name in ("README.md", "docs/GETTING_STARTED.md", "docs/MEMORY.md", "docs/SCALING.md", "docs/RESULTS.md")}
DTYPE_WORDS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@cache
def preset(name: str) -> C.Config:
    return C.load_config(name)


DEMO, LLAMA = (lambda: preset("demo")), (lambda: preset("llama3-8b-dual"))
DUAL = lambda: preset("smollm2-dual")  # noqa: E731


def pct(fraction: float) -> float:
    return 100 * fraction


@cache
def demo_parameters() -> int:
    """Parameters of the demo's model as `python grpo_train.py` builds it (its tokenizer is trained on the demo data,
    so the vocabulary, and with it the embedding size, comes from the data)."""
    import tempfile

    import grpo_train

    with tempfile.TemporaryDirectory() as tmp:
        run = grpo_train.setup(C.load_config("demo", [f"train.output_dir={tmp}", "train.run_name=size",
                                                       "train.tensorboard=false"]))
        run.tracker.close()
        return sum(p.numel() for p in run.policy.model.parameters())


LLAMA_SHAPE = ("(Llama-3-8B shape, LoRA r {8}, {bf16}, {gradient checkpointing}, {2} prompts × K {4} × GA {2}, "
               "{96} new tokens)")
LLAMA_SOURCES = [lambda: LLAMA().model.lora_r, lambda: DTYPE_WORDS[LLAMA().model.dtype],
                 lambda: "gradient checkpointing" if LLAMA().model.gradient_checkpointing else "no checkpointing",
                 lambda: LLAMA().train.prompts_per_micro_step, lambda: LLAMA().rollout.k,
                 lambda: LLAMA().train.grad_accum, lambda: LLAMA().rollout.max_new_tokens]

CLAIMS = [
    # docs/RESULTS.md: the demo
    ("docs/RESULTS.md", "builds a tiny Llama-style model ({395}k parameters)",
     [lambda: Rounded(demo_parameters() / 1000)]),
    ("docs/RESULTS.md", "runs a short SFT warm-up on {24} demonstrations", [lambda: DEMO().sft.max_examples]),
    ("docs/RESULTS.md", "then {120} GRPO steps that learn the rest of the rule, evaluating greedy completions of {64} "
     "held-out prompts per task",
     [lambda: DEMO().train.max_steps, lambda: DEMO().data.eval_size]),
    ("docs/RESULTS.md", LLAMA_SHAPE, LLAMA_SOURCES),
    # docs/RESULTS.md: the real model on BBQ + HaluEval
    ("docs/RESULTS.md", "categories × {60} rows, {the three options in a seeded random order} per row and epoch",
     [lambda: DUAL().data.bbq_per_category,
      lambda: "the three options in a seeded random order" if DUAL().data.shuffle_options
      else "options in file order"]),
    ("docs/RESULTS.md", "HaluEval general as {hallucination recognition}",
     [lambda: "hallucination recognition" if DUAL().data.halueval_subsets == ["general_recognition"] else "?"]),
    ("docs/RESULTS.md", "the first {300} rows of each label), prompts over {256} tokens left out",
     [lambda: DUAL().data.halueval_per_subset // 2, lambda: DUAL().data.max_prompt_tokens]),
    ("docs/RESULTS.md",
     "LoRA r {16}, {30} SFT steps on {48} demonstrations (BBQ's three letters and the two verdicts in "
     "turn, references cut to {16} tokens), then {30} RL steps of {4} prompts × K {16} at temperature "
     "{1.0}, {replies stopped at their first line} (at most {8} new tokens), {dynamic sampling}, lr "
     "{0.0001}, β {0.04}; pass@{4} before RL. Greedy held-out answers on {64} prompts per task",
     [lambda: DUAL().model.lora_r, lambda: DUAL().sft.steps, lambda: DUAL().sft.max_examples,
      lambda: DUAL().sft.max_target_tokens, lambda: DUAL().train.max_steps, lambda: DUAL().train.prompts_per_micro_step,
      lambda: DUAL().rollout.k, lambda: DUAL().rollout.temperature,
      lambda: "replies stopped at their first line" if DUAL().rollout.stop_strings == ["\n"] else "not stopped",
      lambda: DUAL().rollout.max_new_tokens,
      lambda: "dynamic sampling" if DUAL().train.dynamic_sampling else "no dynamic sampling", lambda: DUAL().train.lr,
      lambda: DUAL().kl_for("fairness").beta, lambda: DUAL().train.pass_at_k,
      lambda: DUAL().data.eval_size]),
    # docs/GETTING_STARTED.md: the demo's output, healthy metrics, the doctor and the verdict
    ("docs/GETTING_STARTED.md", "(`data.eval_size` ({64} in the demo preset)", [lambda: DEMO().data.eval_size]),
    ("docs/GETTING_STARTED.md", "with `sft.steps` > 0 ({50} in the demo: {24} demonstrations, trained until",
     [lambda: DEMO().sft.steps, lambda: DEMO().sft.max_examples]),
    ("docs/GETTING_STARTED.md", "| `adv/frac_zero_std`, `adv/<task>/frac_zero_std` | well below {0.5}:",
     [lambda: TH.zero_std_max]),
    ("docs/GETTING_STARTED.md", "| `rollout/<task>/truncated` | below {0.2}:", [lambda: TH.truncation_max]),
    ("docs/GETTING_STARTED.md", "its first {40} characters) and that answer: below {0.6} for a task",
     [lambda: symptoms_answer_chars(), lambda: TH.collapse_share]),
    ("docs/GETTING_STARTED.md", "truncation high (`rollout/<task>/truncated` > {0.2}; doctor: `truncation`)",
     [lambda: TH.truncation_max]),
    ("docs/GETTING_STARTED.md", "watches the last {10} RL steps after every step", [lambda: TH.recent_window]),
    ("docs/GETTING_STARTED.md",
     "no red finding, but fewer than {20} RL steps: the checks compare the first {10} steps with the "
     "last {10}", [lambda: TH.min_steps, lambda: TH.recent_window, lambda: TH.recent_window]),
    ("docs/GETTING_STARTED.md", "(or sits at the solved level, {0.9} for 0..1 rewards)", [lambda: TH.solved_reward]),
    ("docs/GETTING_STARTED.md", "| `empty_completions` | red above {80}%, yellow above {50}% |",
     [lambda: pct(TH.empty_red), lambda: pct(TH.empty_share)]),
    ("docs/GETTING_STARTED.md", "the training reward's last {10} steps against its first {10}",
     [lambda: TH.recent_window, lambda: TH.recent_window]),
    ("docs/GETTING_STARTED.md", "| `no_learning_signal` | red after {5} steps in a row", [lambda: TH.no_signal_steps]),
    ("docs/GETTING_STARTED.md", "below its best evaluation during RL by more than {2} standard errors",
     [lambda: end_checks.FELL_Z]),
    ("docs/GETTING_STARTED.md", "when the warm-up loss stayed above {1} nat per token",
     [lambda: window_checks.SFT_UNTAUGHT_LOSS]),
    ("docs/GETTING_STARTED.md",
     "never rose more than {0.05} above its first {10} steps (after at least {20} steps), with more "
     "than {0.5} of its groups zero-std",
     [lambda: TH.stuck_tolerance, lambda: TH.recent_window, lambda: TH.min_steps, lambda: TH.zero_std_max]),
    ("docs/GETTING_STARTED.md",
     "the top answer in at least {50}% of the last {10} steps and holds at least {0.6} of the task's "
     "samples, {0.1} more than in the first {10} steps, while the reward is {0.05} below its best",
     [lambda: pct(window_checks.COLLAPSE_DOMINANCE), lambda: TH.recent_window, lambda: TH.collapse_share,
      lambda: TH.collapse_rise, lambda: TH.recent_window, lambda: TH.collapse_reward_gap]),
    ("docs/GETTING_STARTED.md",
     "entropy below {0.05} nats or down more than {80}% from the first {10} steps, while the held-out "
     "reward fell {0.05} below its best or stalled below the solved level over {3} evaluations",
     [lambda: TH.entropy_floor, lambda: pct(TH.entropy_drop_max), lambda: TH.recent_window, lambda: TH.heldout_drop,
      lambda: window_checks.STALL_EVALS]),
    ("docs/GETTING_STARTED.md", "KL above {3}× its band's top ({1} nat without a band) for {20} steps in a row",
     [lambda: TH.kl_runaway_factor, lambda: TH.kl_runaway_nats, lambda: TH.kl_band_patience]),
    ("docs/GETTING_STARTED.md", "KL outside its band for {20} steps in a row", [lambda: TH.kl_band_patience]),
    ("docs/GETTING_STARTED.md",
     "| yellow above {5}%, red above {25}% | the share of failed judge calls over the last {10} steps",
     [lambda: pct(TH.judge_failure_max), lambda: pct(TH.judge_failure_red), lambda: TH.recent_window]),
    ("docs/GETTING_STARTED.md", "more than {0.2} of a task's completions hit `rollout.max_new_tokens`",
     [lambda: TH.truncation_max]),
    ("docs/GETTING_STARTED.md", "(the zero-std share minus the mean reward above {0.5})", [lambda: TH.zero_std_max]),
    ("docs/GETTING_STARTED.md", "| red above {10}% of the steps, else yellow for any restore",
     [lambda: pct(TH.skipped_max)]),
    ("docs/GETTING_STARTED.md", "red for a held-out fall of more than {0.05}, yellow for no gain",
     [lambda: TH.reward_regression_red]),
    # docs/MEMORY.md: the seed config in prose, and the estimator's constants
    ("docs/MEMORY.md", "LoRA r={8} on the {7} linears, {bf16}, {gradient checkpointing}, K={4}, {2} prompts per "
                               "micro-step, grad_accum {2}, prompts ≤{512} + {96} new tokens",
     [lambda: LLAMA().model.lora_r, lambda: len(LLAMA().model.lora_target_modules),
      lambda: DTYPE_WORDS[LLAMA().model.dtype], LLAMA_SOURCES[2], lambda: LLAMA().rollout.k,
      lambda: LLAMA().train.prompts_per_micro_step, lambda: LLAMA().train.grad_accum,
      lambda: LLAMA().data.max_prompt_tokens, lambda: LLAMA().rollout.max_new_tokens]),
    ("docs/MEMORY.md", "Persistent parts: CUDA context (~{0.75} GiB)", [lambda: DEFAULT_CUDA_OVERHEAD_GB]),
    ("docs/MEMORY.md", "A {5}% allocator slack stands for fragmentation", [lambda: pct(DEFAULT_ALLOCATOR_SLACK)]),
    ("docs/MEMORY.md", "| chunked log-softmax (`grpo/core/kernels.py`, {512} rows) | never builds a (B, T, V) fp32 "
                               "tensor: {512} rows", [lambda: DEFAULT_LOGPROB_CHUNK_ROWS] * 2),
    # SCALING
    ("docs/SCALING.md", "(`model.lora_dropout`, {0.05} in the Llama preset)", [lambda: LLAMA().model.lora_dropout]),
]


def symptoms_answer_chars() -> int:
    from grpo.core.answer_metrics import ANSWER_CLASS_CHARS

    return ANSWER_CLASS_CHARS


class Rounded(float):
    """A value the doc rounds (a measured size): compared to the figure's decimals, not exactly."""


def written(value, figure: str) -> str:
    """`value` as the doc should write it where it writes `figure`: a word as it is; a Rounded number to the figure's
    decimals; any other number exactly (the figure itself when they are equal, else the value)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Rounded):
        decimals = len(figure.split(".")[1]) if "." in figure else 0
        return f"{value:.{decimals}f}"
    try:
        same = float(figure) == pytest.approx(value, rel=1e-12)
    except ValueError:
        same = False
    return figure if same else f"{value:g}"


@pytest.mark.parametrize("doc,claim,sources", CLAIMS, ids=[f"{d}:{c[:40]}" for d, c, _ in CLAIMS])
def test_doc_figure_equals_the_code(doc, claim, sources):
    quoted = re.findall(r"\{([^}]+)\}", claim)
    assert len(quoted) == len(sources), "one source per figure in braces"
    assert claim.replace("{", "").replace("}", "") in DOCS[doc], f"{doc} no longer says {claim!r}"
    for figure, source in zip(quoted, sources, strict=True):
        value = written(source(), figure)
        assert value == figure, f"{doc} says {figure} in {claim!r}; the code gives {value}"


def finding_codes() -> set[str]:
    """Every finding code grpo/run/doctor/ can raise (the window checks and the end-of-run ones)."""
    source = "".join((ROOT / "grpo" / "run" / "doctor" / f"{name}.py").read_text()
                     for name in ("window_checks", "end_checks"))
    return set(re.findall(r'Finding\(\s*(?:"(?:red|yellow)"|level),\s*"(\w+)"', source))


def test_every_finding_has_a_row_in_the_getting_started_doctor_table():
    codes = finding_codes()
    assert set(ONLINE_CODES) <= codes and {"skipped_steps", "reward_regressed", "no_heldout"} <= codes
    table = DOCS["docs/GETTING_STARTED.md"].split("| finding | level |", 1)[1]
    rows = set(re.findall(r"\| ((?:`\w+`(?:, )?)+) \|", table))
    documented = {code for row in rows for code in re.findall(r"`(\w+)`", row)}
    assert codes <= documented, f"docs/GETTING_STARTED.md's doctor table has no row for {sorted(codes - documented)}"


def test_a_changed_figure_is_caught():
    """The check is not vacuous: a figure that is not the code's value comes back as the code's value."""
    assert written(TH.recent_window, "10") == "10" and written(TH.recent_window, "12") == "10"
    assert written(0.05, "0.05") == "0.05" and written(0.05, "0.1") == "0.05"  # thresholds: exactly
    assert written(pct(0.8), "80") == "80" and written(pct(0.8), "80.5") == "80"
    assert written(Rounded(394.624), "395") == "395" and written(Rounded(394.624), "394") == "395"  # sizes: rounded
    assert written("bf16", "fp16") == "bf16"
