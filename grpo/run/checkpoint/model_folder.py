"""A run's model saved as a folder that loads anywhere: the weights (the LoRA adapter, or the full model) and the
tokenizer by save_pretrained, the adapter's base named as a user loads it, and the model card (README.md).

The base a saved adapter names (adapter_config.json's base_model_name_or_path, the card's base_model), `base_name`:
    a packaged model (model.name=smollm2-135m-instruct)  its Hub id (HuggingFaceTB/SmolLM2-135M-Instruct), the card
                                                         saying the weights trained on were a dequantized GGUF
    a folder whose config names a Hub id                 that id (an adapter folder: its own base)
    any other local folder                               its absolute path, with a note (it loads on this machine only)
    a Hub id                                             itself
grpo-dual maps a packaged model's Hub id back to its local conversion when it loads such an adapter
(grpo/models/pretrained.py: `adapter_base`), so its own loading stays offline.

`save_model_folder(run, folder)` is the one code path of every model save that a user loads: final/, TRL's
output_dir, each checkpoint-N, best/, each Pareto point.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any

from grpo.models.modeling import save_pretrained
from grpo.models.pretrained import conversion_note, hub_name, local_model_name
from grpo.run.checkpoint.model_card import model_card
from grpo.run.record import Run

CARD = "README.md"
"""The model card's file name (what the Hub shows, and what peft's save_pretrained writes its template into)."""
ADAPTER_CONFIG = "adapter_config.json"
VERSIONED = ("grpo-dual", "transformers", "torch", "peft", "trl", "datasets")
"""The packages a card lists the versions of (those installed)."""
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _hub_id(value: Any) -> str | None:
    """`value` when it reads as a Hub id (org/name) and names no local path; else None."""
    if isinstance(value, str) and HUB_ID.fullmatch(value) and not Path(value).expanduser().exists():
        return value
    return None


def _named_in(folder: Path) -> str | None:
    """The Hub id a model folder names as what it came from: an adapter's base, or config.json's _name_or_path."""
    for file, key in ((ADAPTER_CONFIG, "base_model_name_or_path"), ("config.json", "_name_or_path")):
        try:
            value = json.loads((folder / file).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if _hub_id(value):
            return value
    return None


def base_name(model_name: str) -> tuple[str | None, str | None]:
    """(the name a user loads the base model by, a sentence on it or None), for model.name `model_name` (module
    docstring). (None, None) for a model that exists only in grpo-dual (builtin:tiny, random:<shape>)."""
    hub = hub_name(model_name)
    if hub:
        return hub, conversion_note(model_name)
    if model_name.startswith(("builtin:", "random:")):
        return None, None
    folder = Path(model_name).expanduser()
    if folder.is_dir():
        named = _named_in(folder)
        if named:
            return named, conversion_note(local_model_name(named))
        where = str(folder.resolve())
        return where, (f"the base model is the local folder {where} (its config names no Hub id), so this output "
                       "loads only where that folder exists: set base_model_name_or_path in adapter_config.json to "
                       "the base's Hub id before sharing it")
    return model_name, None


def _versions() -> dict[str, str]:
    found = {}
    for package in VERSIONED:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _data(run: Run) -> dict[str, dict[str, object]]:
    cfg, samples = run.cfg, run.samples
    rows = {}
    for task in run.tasks:
        spec = cfg.tasks.get(task)
        source = ((spec.path or spec.builder or "rows in memory") if spec is not None
                  else f"data.source={cfg.data.source}")
        rows[task] = {"training rows": len(samples.training.get(task, [])),
                      "held-out rows": len(samples.heldout.get(task, [])), "source": source}
    return rows


def _kl(cfg) -> dict[str, str]:
    out = {}
    for task, kl in cfg.kl.items():
        band = "" if kl.controller == "fixed" else f", target {kl.target:g}, band {kl.band_low:g}-{kl.band_high:g}"
        out[f"β kl.{task}.beta ({kl.controller}{band})"] = f"{kl.beta:g}"
    return out


def settings(run: Run) -> dict[str, object]:
    """The settings that define the run, as a card lists them (each named by its config field)."""
    cfg = run.cfg
    m = cfg.model
    lora = (f"r={m.lora_r}, alpha={m.lora_alpha}, dropout={m.lora_dropout:g}, "
            f"targets={', '.join(m.lora_target_modules)}"
            if run.policy.is_lora else "none: full fine-tuning")
    return {"K: completions per prompt (rollout.k)": cfg.rollout.k, "prompts per RL step": cfg.prompts_per_step,
            "max new tokens (rollout.max_new_tokens)": cfg.rollout.max_new_tokens,
            "temperature (rollout.temperature)": cfg.rollout.temperature, **_kl(cfg),
            "learning rate (train.lr)": cfg.train.lr, "lr schedule (train.lr_scheduler)": cfg.train.lr_scheduler,
            "RL steps (train.max_steps)": cfg.train.max_steps, "optimizer steps per RL step (loss.mu)": cfg.loss.mu,
            "clip (loss.clip_low, loss.clip_high)": f"{cfg.loss.clip_low:g}, {cfg.loss.clip_high:g}",
            "LoRA (model.lora)": lora, "SFT warm-up steps (sft.steps)": cfg.sft.steps,
            "seed (train.seed)": cfg.train.seed}


def _verdict(run_dir: Path) -> str | None:
    try:
        report = json.loads((run_dir / "report.json").read_text())
    except (OSError, ValueError):
        return None
    reasons = [str(r) for r in report.get("reasons") or []][:3]
    return f"**{report.get('verdict', '?')}**" + (": " + "; ".join(reasons) if reasons else "")


def card_text(run: Run, folder: Path, what: str) -> str:
    """The card of the run's current model saved in `folder` (`what`: which save it is)."""
    base, note = base_name(run.cfg.model.name)
    evals = run.progress.evals
    results = {p: evals[p] for p in ("before_sft", "after_sft", "after_rl") if p in evals}
    return model_card(model_id=Path(folder).name, base_model=base, base_note=note, adapter=run.policy.is_lora,
                      policy_loss=run.cfg.loss.policy_loss, agg_mode=run.cfg.loss.agg_mode, step=run.progress.step,
                      what=what, data=_data(run), settings=settings(run), results=results,
                      verdict=_verdict(run.run_dir), versions=_versions())


def write_card(run: Run, folder: str | Path, what: str = "the final model") -> Path:
    """The card of the run's model in `folder` written as folder/README.md (over peft's template); its path."""
    path = Path(folder) / CARD
    path.write_text(card_text(run, Path(folder), what))
    return path


def name_base(folder: Path, base: str | None) -> None:
    """adapter_config.json in `folder` names `base` as base_model_name_or_path (peft writes the path the base was
    loaded from: a machine-local cache folder for a packaged model)."""
    config = folder / ADAPTER_CONFIG
    if base is None or not config.is_file():
        return
    record = json.loads(config.read_text())
    record["base_model_name_or_path"] = base
    config.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def save_model_folder(run: Run, folder: str | Path, state: dict | None = None, what: str = "the final model",
                      say: bool = False) -> Path:
    """The run's current model (the LoRA adapter, or the full model) and tokenizer saved into `folder` with
    save_pretrained, the adapter's base named as a user loads it (`base_name`) and the card; loadable with
    AutoModelForCausalLM / AutoPeftModelForCausalLM + AutoTokenizer. `state`: the whole model's weights gathered
    from FSDP shards; `what`: which save it is, for the card; `say`: print the base's note (once a run)."""
    out = save_pretrained(run.policy, folder, state)
    base, note = base_name(run.cfg.model.name)
    if run.policy.is_lora:
        name_base(out, base)
    if say and note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    write_card(run, out, what)
    return out

