"""Task data: one `DataSpec` (a config section, plain values) -> Samples, and the stable train / held-out split.

    load_task(spec) -> (samples, {"data/<task>/rows": n, "data/<task>/skipped": k})
    split_heldout_samples(samples, heldout_fraction, salt) -> (train, heldout)

Split rule: held out iff int(sha256(salt:id)[:16 hex], 16) / 2**64 < heldout_fraction (stable on every machine).
Loaders live in grpo/data/ (bbq.py, halueval.py); their prompt templates are module constants (BBQ_TEMPLATE,
HALUEVAL_TEMPLATES) and can be replaced per spec with `template`. Generic rows in any form (JSONL, CSV, Parquet,
folders, save_to_disk, datasets builders, the Hub) are read by grpo/data/sources.py; the "jsonl" and "hf" kinds below
are kept for the callers of `DataSpec` and go through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from grpo.core.step_types import Sample
from grpo.data.bbq import BBQ_CATEGORIES, BBQ_TEMPLATE, load_bbq
from grpo.data.generic import row_to_sample
from grpo.data.halueval import DEFAULT_MAX_DOC_CHARS, HALUEVAL_TEMPLATES, load_halueval
from grpo.data.heldout_split import split_heldout, stable_hash01
from grpo.data.json_rows import DataFileError, LoadResult, read_records
from grpo.data.sources import DataSourceError, TaskSource, load_source_samples, load_sources

__all__ = [
    "BBQ_CATEGORIES", "BBQ_TEMPLATE", "HALUEVAL_TEMPLATES", "DataFileError", "DataSourceError", "DataSpec",
    "LoadResult", "TaskSource", "load_bbq", "load_halueval", "load_source_samples", "load_sources", "load_task",
    "read_records", "row_to_sample", "split_heldout_samples", "stable_hash01",
]

KINDS = ("bbq", "halueval", "jsonl", "hf")
DEFAULT_TASK = {"bbq": "fairness", "halueval": "hallucination"}


@dataclass(frozen=True)
class DataSpec:
    """One data source of one task. Maps 1:1 onto a config section."""

    kind: str
    """"bbq" (path = folder of <Category>.jsonl), "halueval" (path = one file), "jsonl" (generic rows) or "hf"
    (local files through datasets.load_dataset)."""
    path: str
    """Folder (bbq) or file (others); for "hf" the data file(s), comma-separated."""
    task: str | None = None
    """Task name; default "fairness" for bbq, "hallucination" for halueval, the rows' own "task" for jsonl."""
    categories: tuple[str, ...] = ()
    """bbq only: categories to load; empty = every category file present."""
    n_per_category: int | None = None
    """bbq only: rows per category, stratified over context_condition × question_polarity; None = all."""
    subset: str | None = None
    """halueval only: qa | dialogue | summarization | general, or <one of them>_recognition; None = detected from
    the fields."""
    limit: int | None = None
    """halueval / jsonl / hf: keep the first `limit` good rows; None = all."""
    max_doc_chars: int = DEFAULT_MAX_DOC_CHARS
    """halueval summarization: documents longer than this are cut at a word break (0 = never cut)."""
    seed: int = 0
    """bbq stratified sampling seed; halueval recognition subsets: which answer each row shows."""
    system_prompt: str | None = None
    """System message put before every prompt; None = no system message."""
    template: str | None = None
    """str.format template replacing the default user prompt (fields: the row's own fields)."""
    shuffle_options: bool = False
    """bbq only: show each row's options in a seeded order per row and epoch (grpo/data/bbq.py)."""
    hf_builder: str = "json"
    """hf only: the datasets builder ("json", "csv", "parquet", ...)."""
    hf_split: str = "train"
    """hf only: the split to read."""
    hf_prompt_field: str = "prompt"
    """hf only: the column holding the prompt (ignored when `template` is given)."""
    hf_id_field: str = "id"
    """hf only: the column holding the row id (missing ids are hashed from the prompt)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"DataSpec.kind={self.kind!r}: use one of {KINDS}")
        if self.kind == "hf" and not self.task:
            raise ValueError("DataSpec.task is required for kind='hf' (rows carry no task name)")
        if self.n_per_category is not None and self.n_per_category < 1:
            raise ValueError(f"DataSpec.n_per_category={self.n_per_category}: use a positive number or None")


def load_task(spec: DataSpec) -> tuple[list[Sample], dict[str, float]]:
    """Samples of one source and its `data/<task>/rows` / `data/<task>/skipped` metrics."""
    task = spec.task or DEFAULT_TASK.get(spec.kind)
    if spec.kind == "bbq":
        result = load_bbq(spec.path, categories=spec.categories or None, n_per_category=spec.n_per_category,
                          seed=spec.seed, task=task or "fairness", system_prompt=spec.system_prompt,
                          template=spec.template or BBQ_TEMPLATE, shuffle_options=spec.shuffle_options)
    elif spec.kind == "halueval":
        result = load_halueval(spec.path, subset=spec.subset, task=task or "hallucination", limit=spec.limit,
                               max_doc_chars=spec.max_doc_chars, system_prompt=spec.system_prompt,
                               template=spec.template, seed=spec.seed)
    else:
        return load_source_samples(task or "", _as_source(spec), spec.system_prompt or "")
    names = sorted({s.task for s in result.samples}) or [str(task)]
    metrics: dict[str, float] = {}
    for name in names:
        metrics[f"data/{name}/rows"] = float(sum(s.task == name for s in result.samples))
    metrics[f"data/{names[0] if len(names) == 1 else 'all'}/skipped"] = float(result.skipped)
    return result.samples, metrics


def _as_source(spec: DataSpec) -> TaskSource:
    """The TaskSource a "jsonl" / "hf" DataSpec stands for (a row's own "task" column names its task)."""
    common = {"template": spec.template or "", "limit": spec.limit or 0, "task_field": "task"}
    if spec.kind == "jsonl":
        return TaskSource(path=spec.path, **common)
    files = [p.strip() for p in spec.path.split(",") if p.strip()]
    return TaskSource(builder=spec.hf_builder, data_files=files, split=spec.hf_split,
                      prompt_field=spec.hf_prompt_field, id_field=spec.hf_id_field, **common)


def split_heldout_samples(
    samples: Sequence[Sample], heldout_fraction: float, salt: str = ""
) -> tuple[list[Sample], list[Sample]]:
    """(train, heldout), order kept: a sample is held out iff stable_hash01(sample.id, salt) < heldout_fraction.

    The side of an id never depends on the other rows, their order, the machine or the Python process."""
    return split_heldout(list(samples), [s.id for s in samples], heldout_fraction, salt)
