"""The model card (README.md) of a saved model, as a pure function of plain values: what it was trained from, how
(grpo-dual's GRPO or GSPO, the loss), on what data, with which settings, how it scored on the held-out rows, the
doctor's verdict, the framework versions, how to load it, and the papers to cite. TRL writes such a card beside
every model it saves; peft's save_pretrained leaves a template of "[More Information Needed]" sections, which the
card replaces. grpo/run/checkpoint/model_folder.py gathers the values from a run and writes it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

CITATIONS = {
    "GRPO": ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models (GRPO)",
             "@article{shao2024deepseekmath,\n    title   = {{DeepSeekMath: Pushing the Limits of Mathematical "
             "Reasoning in Open Language Models}},\n    author  = {Zhihong Shao and Peiyi Wang and Qihao Zhu and "
             "Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},\n"
             "    year    = 2024,\n    eprint  = {arXiv:2402.03300},\n}"),
    "GSPO": ("Group Sequence Policy Optimization (GSPO), Zheng et al. 2025",
             "@article{zheng2025gspo,\n    title   = {{Group Sequence Policy Optimization}},\n    author  = {Chujie "
             "Zheng and Shixuan Liu and Mingze Li and Xiong-Hui Chen and Bowen Yu and Chang Gao and Kai Dang and "
             "Yuqiong Liu and Rui Men and An Yang and Jingren Zhou and Junyang Lin},\n    year    = 2025,\n"
             "    eprint  = {arXiv:2507.18071},\n}"),
}
"""What each method's card cites: the paper's title and its BibTeX (GRPO: DeepSeekMath, arXiv 2402.03300; GSPO:
arXiv 2507.18071)."""


def method_of(policy_loss: str) -> str:
    """The method a card names for loss.policy_loss: GSPO for the sequence-level losses (gspo, gspo_token), GRPO for
    the rest (grpo and the group-relative variants built on it)."""
    return "GSPO" if policy_loss.startswith("gspo") else "GRPO"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _front_matter(base_model: str | None, adapter: bool, method: str) -> list[str]:
    lines = ["---"] + ([f"base_model: {base_model}"] if base_model else [])
    lines += [f"library_name: {'peft' if adapter else 'transformers'}", "tags:", "- grpo-dual",
              f"- {method.lower()}", "- trl"]
    return lines + ["---", ""]


def _quick_start(model_id: str, adapter: bool) -> list[str]:
    auto = "AutoPeftModelForCausalLM" if adapter else "AutoModelForCausalLM"
    source = "peft" if adapter else "transformers"
    return ["## Quick start", "", "```python", f"from {source} import {auto}",
            "from transformers import AutoTokenizer", "",
            f'model = {auto}.from_pretrained("{model_id}")', f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")',
            'messages = [{"role": "user", "content": "Hello!"}]',
            "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\","
            " return_dict=True)", "output = model.generate(**inputs, max_new_tokens=64)",
            "print(tokenizer.decode(output[0][inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))", "```", ""]


def _results(results: Mapping[str, Mapping[str, float]]) -> list[str]:
    if not results:
        return ["No held-out evaluation yet (nothing held out, or the run has not reached one).", ""]
    phases = list(results)
    tasks = sorted({t for scores in results.values() for t in scores})
    rows = [[t] + [_number(results[p].get(t, "—")) for p in phases] for t in tasks]
    return (["The mean reward on the held-out rows (greedy decoding), per task:", ""] +
            _table(["task"] + phases, rows) + [""])


def model_card(*, model_id: str, base_model: str | None, base_note: str | None, adapter: bool, policy_loss: str,
               agg_mode: str, step: int, what: str, data: Mapping[str, Mapping[str, object]],
               settings: Mapping[str, object], results: Mapping[str, Mapping[str, float]],
               verdict: str | None, versions: Mapping[str, str]) -> str:
    """The card's Markdown. model_id: what the quick start loads (the folder); base_model: the name a user loads the
    base by (None: a model that exists only in grpo-dual, such as builtin:tiny); base_note: a sentence on it (a
    conversion, a local path); adapter: a LoRA adapter (else the full model); step: the RL step of these weights;
    what: which save this is ("the final model", "checkpoint 3", ...); data: {task: {"training rows", "held-out
    rows", "source"}}; settings: {name: value}; results: {phase: {task: held-out reward}} (eval.json's phases in
    order); verdict: the doctor's (report.json), None before it exists; versions: {package: version}."""
    method = method_of(policy_loss)
    kind = "a LoRA adapter for" if adapter else "a fine-tuned version of"
    base = (f"[{base_model}](https://huggingface.co/{base_model})" if base_model and "/" in base_model and
            not base_model.startswith(("/", ".", "~")) else f"`{base_model or 'a model built in grpo-dual'}`")
    lines = _front_matter(base_model, adapter, method)
    lines += [f"# {model_id.rstrip('/').rsplit('/', 1)[-1]}", "",
              f"This model is {kind} {base}, trained with grpo-dual's {method} (loss.policy_loss={policy_loss}, "
              f"loss.agg_mode={agg_mode}) for {step} RL step(s): {what}.", ""]
    if base_note:
        lines += [f"Note: {base_note}.", ""]
    lines += _quick_start(model_id, adapter)
    lines += ["## Training data", ""] + _table(
        ["task", "training rows", "held-out rows", "source"],
        [[t, d.get("training rows", "—"), d.get("held-out rows", "—"), d.get("source", "—")] for t, d in data.items()])
    lines += ["", "## Training settings", ""] + _table(["setting", "value"],
                                                        [[k, _number(v)] for k, v in settings.items()])
    lines += ["", "## Held-out results", ""] + _results(results)
    lines += ["## Doctor's verdict", "",
              f"{verdict}" if verdict else "Not known yet: the run's report.json is written when it ends.", ""]
    lines += ["## Framework versions", ""] + [f"- {name}: {version}" for name, version in versions.items()] + [""]
    title, bibtex = CITATIONS[method]
    lines += ["## Citations", "", f"{method}: {title}", "", "```bibtex", bibtex, "```", ""]
    return "\n".join(lines)
