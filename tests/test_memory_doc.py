"""Every figure docs/MEMORY.md quotes from the estimator equals what `check_gpu_memory.py --estimate` prints.

Each claim is a piece of the doc with its figures in braces, e.g. "r=64 → {22.7} GiB", and one function per figure that
reads it off the tool's printed table (run in process); the doc must hold the piece with the braces removed, and each
figure must be the tool's value printed to the doc's precision. The three sample output blocks must equal the tool's
output for the command written above each. When the estimator changes, these tests name the stale figure and the
new value: update the doc from the tool's output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
from functools import cache

import pytest
from conftest import ROOT

from grpo.run.assembly import gpu_memory_check

DOC = (ROOT / "docs" / "MEMORY.md").read_text()
OFF = ("model.fused_lm_head=false", "model.shared_prompt_forward=off")
"""The logits path and one prompt per row: the knob table and the H100 measurements use them (the doc says so)."""
NO_CKPT = "model.gradient_checkpointing=false"
QLORA = "model.load_in_4bit=true"


def figures(*sets: str, gpu: str = "a100-40", **changes) -> dict:
    """The tool's estimate for `--preset llama3-8b-dual --gpu GPU --set ...` in GiB, unrounded (the doc rounds them
    once, as the tool's own lines do): peak, peak phase, phase totals, parts by (phase, name), headroom on the card.
    `changes` set inputs the command line cannot (logits_to_keep, the k-bit fp32 upcast)."""
    from grpo.config import load_config
    from grpo.machine.memory_estimate import GIB, estimate
    from grpo.run.assembly.memory_inputs import inputs_from_config

    gpu_gib, capability = gpu_memory_check.GPUS[gpu]
    x = inputs_from_config(load_config("llama3-8b-dual", list(sets)), capability)
    est = estimate(dataclasses.replace(x, **changes))
    parts = {("persistent", k): v / GIB for k, v in est.persistent.items()}
    parts |= {(p, k): v / GIB for p, ps in est.phases.items() for k, v in ps.items()}
    return {"peak": est.peak_bytes / GIB, "peak_phase": est.peak_phase, "part": parts,
            "phase": {p: est.total(p) / GIB for p in est.phases}, "headroom": gpu_gib - est.peak_bytes / GIB}


@cache
def tool(*sets: str, gpu: str = "a100-40") -> dict:
    return figures(*sets, gpu=gpu)


def estimator(*sets: str, **changes) -> dict:
    return figures(*sets, **changes)


def peak(*sets, **kw):
    return lambda: tool(*sets, **kw)["peak"]


def phase(name, *sets):
    return lambda: tool(*sets)["phase"][name]


KEPT = "kept decoding buffers (graph engine)"
"""The part of the ref/old pass and training phases that is the graph engine's buffers kept between rollouts: sized
to what the peak leaves free, so a phase's own need is its total without it."""


def own(name, *sets):
    return lambda: tool(*sets)["phase"][name] - tool(*sets)["part"].get((name, KEPT), 0.0)


def part(phase_name, part_name, *sets):
    return lambda: tool(*sets)["part"][(phase_name, part_name)]


def headroom(*sets, gpu):
    return lambda: tool(*sets, gpu=gpu)["headroom"]


WEIGHTS = part("persistent", "base weights", *OFF)
VOCAB_ROWS_GIB = 128_256 * 4 * 2 / 2**30
"""Bytes of one row of fp32 log-softmax temporaries over Llama-3's 128,256-token vocabulary (value + gradient)."""

CLAIMS = [
    # the defaults (fused LM head and shared prompts on)
    ("estimate is {18.7} GiB, its generation phase now the peak (training {18.3} GiB of its own, from {20.4})",
     [peak(), own("training"), peak(*OFF)]),
    ("llama3-8b-dual --set model.gradient_checkpointing=false` gives {37.0} GiB ({68.6} GiB with",
     [peak(NO_CKPT), peak(NO_CKPT, "model.shared_prompt_forward=off")]),
    # the knob table (both off)
    ("bf16 weights {15.0} GiB; fp32 doubles them and the activations (peak {38.1} GiB)",
     [WEIGHTS, peak(*OFF, "model.dtype=float32")]),
    ("r=64 → {22.7} GiB", [peak(*OFF, "model.lora_r=64")]),
    ("Without checkpointing: all 7 targets {68.6} GiB, q,v only {45.0} GiB; with checkpointing {20.4} vs {19.4}",
     [peak(*OFF, NO_CKPT), peak(*OFF, NO_CKPT, "model.lora_target_modules=q_proj,v_proj"), peak(*OFF),
      peak(*OFF, "model.lora_target_modules=q_proj,v_proj")]),
    ("{62.7} → {68.6} GiB without checkpointing", [peak(*OFF, NO_CKPT, "model.lora_dropout=0"), peak(*OFF, NO_CKPT)]),
    ("weights {15.0} → {7.3} GiB", [WEIGHTS, part("persistent", "base weights", *OFF, QLORA)]),
    ("unquantised); peak {14.3} GiB", [peak(*OFF, QLORA)]),
    ("({10.3} GiB peak without that upcast)", [lambda: estimator(*OFF, QLORA, kbit_fp32_upcast=False)["peak"]]),
    ("| {68.6} → {20.4} GiB: keeps each layer's input", [peak(*OFF, NO_CKPT), peak(*OFF)]),
    ("8 → 4 sequences: {18.6} GiB of its own (generation, {18.7}, becomes the peak)",
     [own("training", *OFF, "train.prompts_per_micro_step=1", "train.grad_accum=4"),
      phase("generation", *OFF, "train.prompts_per_micro_step=1", "train.grad_accum=4")]),
    ("K=8 → {24.0} GiB", [peak(*OFF, "rollout.k=8")]),
    ("96 → 256 gives {21.3} GiB", [peak(*OFF, "rollout.max_new_tokens=256")]),
    ("512 → 1024 gives {23.4} GiB", [peak(*OFF, "data.max_prompt_tokens=1024")]),
    ("no new peak ({17.7} GiB pass)", [phase("ref/old pass", *OFF, "loss.mu=2")]),
    ("({0.19} vs {1.16} GiB per micro-batch, {21.1} GiB peak without it)",
     [part("ref/old pass", "logits (no_grad)", *OFF),
      lambda: estimator(*OFF, logits_to_keep=False)["part"][("ref/old pass", "logits (no_grad)")],
      lambda: estimator(*OFF, logits_to_keep=False)["peak"]]),
    ("= {0.49} GiB of temporaries instead of {0.73} GiB for 8 × 96 rows",
     [part("ref/old pass", "log-softmax chunk (fp32)", *OFF), lambda: 8 * 96 * VOCAB_ROWS_GIB]),
    ("no second copy: saves {15.0} GiB against the old design", [WEIGHTS]),
    ("({20.9} GiB at S=608", [peak(*OFF, "model.attn_implementation=eager")]),
    ("plus the prompt's KV repeated K times ({0.5} GiB without checkpointing)",
     [part("training", "prompt KV repeated K times (all layers)", "model.fused_lm_head=false", NO_CKPT)]),
    ("Seed config (checkpointing on): training {20.4} → {18.3} GiB of its own; without checkpointing {68.6} → {37.0} "
     "GiB",
     [own("training", *OFF), own("training", "model.fused_lm_head=false"), peak(*OFF, NO_CKPT),
      peak("model.fused_lm_head=false", NO_CKPT)]),
    ("= 60 GiB before activations: {82} GiB, does not fit 80 GiB", [peak(*OFF, "model.lora=false")]),
    # the estimates table (the preset as it is)
    ("| LoRA bf16, gradient checkpointing (the preset) | {18.7} GiB (generation) | fits, +{20.9} GiB | fits, +{61.3} "
     "GiB |",
     [peak(), headroom(gpu="a100-40"), headroom(gpu="a100-80")]),
    ("| LoRA bf16, no checkpointing | {37.0} GiB (training) | fits, +{2.6} GiB | fits, +{43.0} GiB |",
     [peak(NO_CKPT), headroom(NO_CKPT, gpu="a100-40"), headroom(NO_CKPT, gpu="a100-80")]),
    ("| QLoRA nf4, gradient checkpointing | {12.3} GiB (generation) | fits, +{27.3} GiB | fits, +{67.7} GiB |",
     [peak(QLORA), headroom(QLORA, gpu="a100-40"), headroom(QLORA, gpu="a100-80")]),
    ("that second copy's {14.96} GiB on top of the\nestimator's {18.7} GiB for this trainer makes about {33.7} GiB",
     [WEIGHTS, peak(), lambda: tool()["peak"] + tool()["part"][("persistent", "base weights")]]),
    # the decoding engine and the LoRA fold (the preset as it is)
    ("(seed config: generation {18.7} GiB)", [phase("generation")]),
    ("a copy of every adapted weight during rollouts: {13.0} GiB for Llama-3-8B's 7 linears, which would take the seed "
     "config to {32.4} GiB", [part("generation", "folded LoRA weights (rollout copy)", "rollout.fold_lora=on"),
                             peak("rollout.fold_lora=on")]),
    # the H100 check of the formulas (logits path, both off)
    ("19.44 GiB ({20.38} with slack)", [phase("training", *OFF)]),
    ("65.40 GiB ({68.63} with slack)", [phase("training", *OFF, NO_CKPT)]),
]


@pytest.mark.parametrize("claim,sources", CLAIMS, ids=[c[0][:48] for c in CLAIMS])
def test_doc_figure_equals_the_tool(claim, sources):
    quoted = re.findall(r"\{([^}]+)\}", claim)
    assert len(quoted) == len(sources), "one source per figure in braces"
    assert claim.replace("{", "").replace("}", "") in DOC, f"docs/MEMORY.md no longer says {claim!r}"
    for figure, source in zip(quoted, sources, strict=True):
        decimals = len(figure.split(".")[1]) if "." in figure else 0
        value = f"{source():.{decimals}f}"
        assert value == figure, f"docs/MEMORY.md says {figure} in {claim!r}; the tool gives {value}"


def test_preset_peaks_in_the_phases_the_doc_names():
    assert tool()["peak_phase"] == "generation" and tool(QLORA)["peak_phase"] == "generation"
    assert tool(NO_CKPT)["peak_phase"] == "training"
    assert tool(*OFF, "loss.mu=2")["peak"] == tool(*OFF)["peak"]  # "μ > 1 ...: no new peak"


BLOCK = re.compile(r"`(python check_gpu_memory\.py --estimate[^`]*)`\n```\n(.*?)\n```", re.S)


def test_sample_output_blocks_are_the_tools_output():
    blocks = BLOCK.findall(DOC)
    assert len(blocks) == 3
    for command, shown in blocks:
        argv = shlex.split(command)[2:]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert gpu_memory_check.check_gpu_memory(argv) == 0
        assert shown == buf.getvalue().rstrip("\n"), f"the block under `{command}` is stale; paste the tool's output"
