"""The generate phase: one batched decode for all prompts × K, cut at the first stop token, as typed `Rollout` records.

`generate_rollouts` calls the engine that `decoder` picks (rollout.engine), and each engine holds its one sampler:

    graph   grpo/models/graph_decode.decode_graph: a fixed-shape step, compiled and (CUDA) captured, sampler inside
    lean    grpo/models/decode.decode: a Python loop over the model's one-token steps; draws at `# THE SAMPLER`
    hf      `decode_hf` here: transformers' `generate` (the seeded sampler of grpo/decoding/sampling.py as its last
            processor when each completion has its own stream)

    rollouts[i*K:(i+1)*K] are the K completions of samples[i]
    frequency / presence penalty: logit_j -= c_j · frequency + 1[c_j > 0] · presence, c_j = count of j in the
        completion so far (prompt excluded)                           (OpenAI API reference, "Parameter details")
    sanitiser: NaN → NAN_LOGIT, +Inf → POSINF_LOGIT, -Inf → NEGINF_LOGIT, so the sampler never sees a non-finite value
    temperature / top-k / top-p / min-p / repetition penalty: Hugging Face's own warpers
        (note: HF's repetition penalty, unlike the two penalties above, also counts prompt tokens)
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from grpo.config import RolloutConfig
from grpo.core.registry import Registry
from grpo.core.step_types import Rollout, Sample
from grpo.decoding.decode import check_keys, decode, lean_blocker, ours
from grpo.decoding.graph_decode import decode_graph, graph_blocker
from grpo.decoding.sampling import SeededSampler
from grpo.models.modeling import generation_mode
from grpo.models.tokens import encode_prompt, left_pad, stop_token_id

CACHE_IMPLEMENTATIONS: Registry[None] = Registry("rollout.cache_implementation", "KV cache of generate")
"""KV caches `generate` may use, by name (rollout.cache_implementation; `decode_hf` passes it on)."""
CACHE_IMPLEMENTATIONS.register("dynamic", "grown per step", None)
CACHE_IMPLEMENTATIONS.register("static", "laid out once at prompt + max_new_tokens columns, which lets transformers "
                               "compile its decoding step on CUDA (the hf engine only)", None)
STATIC_PROMPT_BUCKET = 64
"""With the static cache, prompts are left-padded to a multiple of this many columns, so the cache (and the compiled
decoding step) takes one of a few shapes instead of a new one, and a recompile, whenever the longest prompt changes.
Padding is masked and position ids come from the mask, so the sampled ids and their log-probs stay the same."""

ENGINES: Registry[Callable[..., Any] | None] = Registry("rollout.engine", "decoding engine")
"""How rollouts are decoded, by name (rollout.engine): each a `DecodeEngine` (below); "auto" has none of its own, it
picks one per call (`choose_engine`)."""
ENGINES.register("auto", "graph on CUDA where it applies, else lean where it applies, else hf", None)
ENGINES.register("lean",
                 "a Python loop over the model's one-token steps, stopped rows dropped (grpo/decoding/decode.py)",
                 decode)
ENGINES.register("graph", "one fixed-shape step, compiled and (CUDA) captured, replayed per token "
                 "(grpo/decoding/graph_decode.py)", decode_graph)

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def build_generation_config(rollout: RolloutConfig, pad_id: int, stop_ids: Sequence[int], *, do_sample: bool = True,
                            cache_implementation: str = "dynamic"):
    """A GenerationConfig carrying every setting of `rollout` (sampling ones only when `do_sample`); warns (once) if
    the installed transformers does not know or does not keep one of them, or judges the combination invalid,
    instead of letting it be dropped silently. Neutral values are passed explicitly, so a model's
    generation_config.json default (e.g. top_k=20) never sneaks in."""
    from transformers import GenerationConfig

    wanted: dict[str, Any] = {"do_sample": do_sample, "max_new_tokens": rollout.max_new_tokens,
                              "min_new_tokens": rollout.min_new_tokens,
                              "repetition_penalty": rollout.repetition_penalty,
                              "eos_token_id": [int(i) for i in stop_ids], "pad_token_id": int(pad_id)}
    if do_sample:
        wanted.update(temperature=rollout.temperature, top_k=rollout.top_k, top_p=rollout.top_p)
        if rollout.min_p > 0:  # min_p=0.0 would still add a full-vocabulary softmax per step in transformers
            wanted["min_p"] = rollout.min_p
    if cache_implementation != "dynamic":  # None = transformers' default, the dynamic cache
        wanted["cache_implementation"] = cache_implementation
    known = GenerationConfig()
    config = GenerationConfig(**wanted)
    for key, value in wanted.items():
        if not hasattr(known, key) or getattr(config, key, None) != value:
            _warn_once(f"generation setting {key}={value!r} is not supported by the installed transformers and "
                       "would be ignored; upgrade transformers (pip install -U transformers) or leave it at its "
                       "neutral value")
    try:
        config.validate(strict=True)
    except ValueError as err:
        _warn_once(f"transformers flags the generation settings as partly ignored: {err}")
    return config


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed the torch RNG for the block and restore the outer RNG state afterwards; no-op for seed=None."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def cut_completion(ids: Sequence[int], stop_ids: Sequence[int]) -> tuple[list[int], bool]:
    """(ids up to and including the first stop id, stopped). Without a stop id all ids are kept: they were sampled
    (even one that equals the pad id), because generation pads only rows that already stopped."""
    stops = set(stop_ids)
    for t, tok in enumerate(ids):
        if tok in stops:
            return list(ids[:t + 1]), True
    return list(ids), False


def rollout_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """`rollout/<task>/{length,stopped,truncated}` means per task, `rollout/num`, `rollout/tokens`. The length counts
    the tokens the model wrote (a multi-turn trajectory's replies, not its tool results: Rollout.model_tokens);
    rollout/tokens every completion token, tool results included (what the passes process)."""
    by_task: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        by_task[r.sample.task].append(r)
    metrics: dict[str, float] = {"rollout/num": float(len(rollouts)),
                                 "rollout/tokens": float(sum(len(r.completion_ids) for r in rollouts))}
    for task, rs in sorted(by_task.items()):
        n = len(rs)
        metrics[f"rollout/{task}/length"] = sum(r.model_tokens for r in rs) / n
        metrics[f"rollout/{task}/stopped"] = sum(r.stopped for r in rs) / n
        metrics[f"rollout/{task}/truncated"] = sum(r.truncated for r in rs) / n
    return metrics


def choose_engine(model, engine: str, cache_implementation: str, synced_gpus: bool, on_cuda: bool | None = None) -> str:
    """"graph", "lean" or "hf" for this call (`engine` is rollout.engine); an explicit engine that cannot apply is an
    error naming why, never a silent switch. auto: graph on CUDA where it applies (the step compiled and captured),
    else lean where it applies, else hf; the static cache (generate's compiled decoding) is hf's."""
    if engine == "hf":
        return "hf"
    blocker = lean_blocker(model, cache_implementation, synced_gpus)
    if engine in ("graph", "auto") and blocker is None:
        graph = graph_blocker(model)
        if on_cuda is None:
            on_cuda = next(model.parameters()).device.type == "cuda"
        if graph is None and (engine == "graph" or on_cuda):
            return "graph"
        if engine == "graph":
            raise ValueError(f"rollout.engine=graph cannot decode here: {graph}. Use rollout.engine=auto (it picks "
                             "the lean loop or transformers' generate in this case), lean or hf")
    if blocker is None:
        return "lean"
    if engine in ("lean", "graph"):
        raise ValueError(f"rollout.engine={engine} cannot decode here: {blocker}. Use rollout.engine=auto (it picks "
                         "transformers' generate in this case) or rollout.engine=hf")
    return "hf"


@dataclass(frozen=True)
class SamplingPlan:
    """How one rollout call draws its completions; the run's sampling settings are its `rollout` section."""

    greedy: bool = False
    """One top-1 completion per sample (evaluation), with the dynamic cache: the sampling settings do not apply."""
    per_sample: int | None = None
    """Completions per sample; None = rollout.k (1 when greedy). 1 for a group split over processes, each sample then
    standing for one completion of its group."""
    generator_seed: int | None = None
    """Seed the sampling RNG for this call only; None = the global torch RNG."""
    row_keys: Sequence[int] | None = None
    """One key per completion: each is drawn from its own random stream (grpo/decoding/sampling.py), so it does not
    depend on the other prompts of the batch (data-parallel runs shard prompts over processes)."""

    def k(self, rollout: RolloutConfig) -> int:
        """Completions per sample."""
        return 1 if self.greedy else self.per_sample or rollout.k  # rollout.k >= 2: RolloutConfig checks it


GREEDY = SamplingPlan(greedy=True)
"""The evaluation's plan: one top-1 completion per sample."""


def generate_rollouts(model, tokenizer, samples: Sequence[Sample], rollout: RolloutConfig,
                      stop_ids: Sequence[int] | None = None, *, system_prompt: str | None = None,
                      plan: SamplingPlan = SamplingPlan(),
                      synced_gpus: bool = False) -> tuple[list[Rollout], dict[str, float]]:
    """`plan.k(rollout)` completions per sample (rollout.k sampled ones, or one greedy one: see `SamplingPlan`) from ONE
    batched decode by the engine `decoder` picks (rollout.engine). `stop_ids`: the ids that end a completion (kept
    as its last id; `grpo.run.assembly.owners.stop_token_ids` resolves rollout.stop_strings); None = the tokenizer's
    end-of-turn / EOS token.

    Returns the rollouts (samples[i]'s K rollouts at [i*K, (i+1)*K)) and metrics (see `rollout_metrics`, plus
    `rollout/nonfinite_logit_rows`: sampler steps × rows whose logits the sanitiser had to fix).
    `synced_gpus`: keep decoding until every process is done (FSDP: each forward is a collective).
    """
    k = plan.k(rollout)
    if not samples:
        raise ValueError("generate_rollouts: no samples given")
    stop_ids = [int(i) for i in stop_ids or ()] or [stop_token_id(tokenizer)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    prompts = [encode_prompt(tokenizer, s.messages, system_prompt) for s in samples]
    repeated = [p for p in prompts for _ in range(k)]
    decode_with = decoder(model, rollout, plan.greedy, synced_gpus)
    with _seeded(plan.generator_seed, next(model.parameters()).device):
        completions, rows_fixed = decode_with(model, repeated, rollout, stop_ids, pad_id, greedy=plan.greedy,
                                              row_keys=plan.row_keys)

    rollouts = []
    for row, (prompt, raw) in enumerate(zip(repeated, completions, strict=True)):
        ids, stopped = cut_completion(raw, stop_ids)
        rollouts.append(Rollout(sample=samples[row // k], prompt_ids=tuple(prompt), completion_ids=tuple(ids),
                                text=tokenizer.decode(ids, skip_special_tokens=True), stopped=stopped,
                                truncated=not stopped))
    metrics = rollout_metrics(rollouts)
    metrics["rollout/nonfinite_logit_rows"] = float(rows_fixed)
    return rollouts, metrics


def greedy_complete(model, tokenizer, samples: Sequence[Sample], rollout: RolloutConfig,
                    stop_ids: Sequence[int] | None = None, *, system_prompt: str | None = None,
                    synced_gpus: bool = False) -> tuple[list[Rollout], dict[str, float]]:
    """One greedy (top-1) completion per sample (evaluation), with `rollout`'s length limits, repetition and
    presence / frequency penalties and engine; its sampling settings do not apply.

    Always with the dynamic cache: evaluation batches vary in size, and every new shape would recompile the static
    cache's compiled decoding step."""
    return generate_rollouts(model, tokenizer, samples, rollout, stop_ids, system_prompt=system_prompt, plan=GREEDY,
                             synced_gpus=synced_gpus)


DecodeEngine = Callable[..., tuple[list[list[int]], Any]]
"""An engine: (model, rows, rollout, stop_ids, pad_id, *, greedy, row_keys) -> (the raw new ids of each row, the
sanitiser's count of fixed logit rows). Rows are token ids, unpadded; cut the new ids with `cut_completion`."""


def decoder(model, rollout: RolloutConfig, greedy: bool, synced_gpus: bool = False) -> DecodeEngine:
    """The engine that decodes this call (`choose_engine`): grpo/models/graph_decode.decode_graph,
    grpo/models/decode.decode (the lean loop) or `decode_hf` (transformers' generate)."""
    cache_implementation = "dynamic" if greedy else rollout.cache_implementation
    engine = choose_engine(model, rollout.engine, cache_implementation, synced_gpus)
    fn = ENGINES.get(engine)
    return functools.partial(fn, synced_gpus=synced_gpus) if engine == "hf" else fn


@ENGINES.register("hf", "transformers' generate (with the seeded sampler when each completion has its own stream)")
def decode_hf(model, rows: Sequence[Sequence[int]], rollout: RolloutConfig, stop_ids: Sequence[int], pad_id: int, *,
              greedy: bool, row_keys: Sequence[int] | None = None,
              synced_gpus: bool = False) -> tuple[list[list[int]], torch.Tensor | int]:
    """The hf engine: transformers' `generate` on `rows`, with our processors (`ours`) where it puts a caller's and,
    given `row_keys`, the seeded sampler (grpo/decoding/sampling.py) drawing each row from its own stream."""
    from transformers import LogitsProcessorList

    do_sample = not greedy
    cache_implementation = "dynamic" if greedy else rollout.cache_implementation
    bucket = STATIC_PROMPT_BUCKET if cache_implementation == "static" else 1
    ids_BP, mask_BP = left_pad(rows, pad_id, multiple_of=bucket)
    prompt_len = int(ids_BP.shape[1])
    processors, sanitizer = ours(rollout, prompt_len)
    if row_keys is not None and do_sample:
        check_keys(row_keys, rows)
        # our sampler draws the token (warpers included); generate then only takes its one-hot argmax
        processors.append(SeededSampler(row_keys, prompt_len, rollout.temperature, rollout.top_k, rollout.top_p,
                                        rollout.min_p))
        do_sample = False
    config = build_generation_config(rollout, pad_id, stop_ids, do_sample=do_sample,
                                     cache_implementation=cache_implementation)
    device = next(model.parameters()).device
    with generation_mode(model), torch.no_grad():
        out = model.generate(input_ids=ids_BP.to(device), attention_mask=mask_BP.to(device), generation_config=config,
                             logits_processor=LogitsProcessorList(processors),
                             **({"synced_gpus": True} if synced_gpus else {}))
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    return sequences[:, prompt_len:].tolist(), sanitizer.rows_fixed
