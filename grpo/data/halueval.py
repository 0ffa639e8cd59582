"""HaluEval (Li et al. 2023) loader for the qa, dialogue, summarization and general files.

Gold fields are unified across subsets so graders and the judge read one schema:
  subset, knowledge (qa/dialogue knowledge, or the possibly cut summarization document), right_answer,
  hallucinated_answer (answer / response / summary), question or dialogue_history, format.
general: subset, user_query, reference_response (ChatGPT's), hallucination ("yes"|"no"), hallucination_spans.
Recognition subsets ("<subset>_recognition", data.halueval_subsets; read from the <subset> file): the prompt shows
a reply and asks whether it holds a hallucination ("Answer: Yes" / "Answer: No"); gold: subset, hallucination
("yes" | "no": the label to recognise), format "answer", shown_answer. general_recognition shows ChatGPT's response
(label: the row's `hallucination` field; under a row limit, at most half the rows of each label);
qa / dialogue / summarization_recognition show the right or the hallucinated answer, which one drawn by
random.Random(f"{seed}:{row id}") (label "yes" when the hallucinated one).
Row ids: general uses its ID field (a repeated ID gets "@line<N>" appended: the public file repeats ID "ID");
the other subsets have no id, so a sha256 of the identifying text is used (stable across machines).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo.core.rule_graders import token_f1
from grpo.core.step_types import Sample
from grpo.data.heldout_split import content_id
from grpo.data.json_rows import DataFileError, LoadResult, read_records
from grpo.data.row_fields import TemplateFieldError, fill_template, missing_fields

SUBSET_FIELDS: dict[str, tuple[str, ...]] = {
    "qa": ("knowledge", "question", "right_answer", "hallucinated_answer"),
    "dialogue": ("knowledge", "dialogue_history", "right_response", "hallucinated_response"),
    "summarization": ("document", "right_summary", "hallucinated_summary"),
    "general": ("ID", "user_query", "chatgpt_response", "hallucination"),
}
DEFAULT_MAX_DOC_CHARS = 4000  # ~1k tokens: keeps summarization prompts inside small models' context
TRUNCATION_MARK = " …"

_EVIDENCE_LINE = 'then on the next line "Evidence: <a sentence quoted word for word from the knowledge>".'
HALUEVAL_TEMPLATES: dict[str, str] = {
    "qa": (
        "Knowledge: {knowledge}\nQuestion: {question}\n\n"
        'Answer using only the knowledge. Reply on the first line with "Answer: <answer>", ' + _EVIDENCE_LINE
    ),
    "dialogue": (
        "Knowledge: {knowledge}\nDialogue:\n{dialogue_history}\n\n"
        'Give the assistant\'s next response using only the knowledge. Reply on the first line with '
        '"Answer: <response>", ' + _EVIDENCE_LINE
    ),
    "summarization": (
        "Document: {document}\n\n"
        'Summarize the document faithfully in a few sentences. Reply as "Summary: <summary>".'
    ),
    "general": (
        "{user_query}\n\n"
        'Reply as "Answer: <answer>". If you are not sure of a fact, say so instead of guessing.'
    ),
}
"""User prompt per subset; str.format fields are the row's own fields (document is already cut)."""
_VERDICT = ('Does the {what} contain a hallucination (a claim that is false, made up or not supported{by})? '
            'Reply "Answer: Yes" if it does or "Answer: No" if it does not.')
RECOGNITION_TEMPLATES: dict[str, str] = {
    "general": "User query: {user_query}\nResponse: {shown_answer}\n\n" + _VERDICT.format(what="response", by=""),
    "qa": ("Knowledge: {knowledge}\nQuestion: {question}\nProposed answer: {shown_answer}\n\n"
           + _VERDICT.format(what="proposed answer", by=" by the knowledge")),
    "dialogue": ("Knowledge: {knowledge}\nDialogue:\n{dialogue_history}\nProposed response: {shown_answer}\n\n"
                 + _VERDICT.format(what="proposed response", by=" by the knowledge")),
    "summarization": ("Document: {document}\nProposed summary: {shown_answer}\n\n"
                      + _VERDICT.format(what="proposed summary", by=" by the document")),
}
"""User prompt of each recognition subset "<subset>_recognition"; fields: the row's own and shown_answer."""
RECOGNITION = {f"{s}_recognition": s for s in RECOGNITION_TEMPLATES}
"""Recognition subset -> the subset whose file and fields it reads."""
_PAIR = {"qa": ("right_answer", "hallucinated_answer"), "dialogue": ("right_response", "hallucinated_response"),
         "summarization": ("right_summary", "hallucinated_summary")}
FORMAT_OF = {"qa": "answer_evidence", "dialogue": "answer_evidence", "summarization": "summary", "general": "answer"}


def detect_subset(row: dict[str, Any]) -> str | None:
    """The subset whose required fields all appear in `row` (None if none match)."""
    for subset, names in SUBSET_FIELDS.items():
        if not missing_fields(row, names):
            return subset
    return None


def cut(text: str, max_chars: int) -> tuple[str, bool]:
    """(text, False) when short enough; else the first max_chars chars, backed off to a word break, + a mark."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    head = text[:max_chars]
    space = head.rfind(" ")
    return (head[:space] if space > max_chars // 2 else head) + TRUNCATION_MARK, True


def best_sentence(knowledge: str, answer: str) -> str:
    """The knowledge sentence with the highest token F1 to the answer (the SFT target's evidence)."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", knowledge.strip()) if s]
    return max(sentences, key=lambda s: token_f1(s, answer)) if sentences else knowledge.strip()


def _gold_and_target(subset: str, row: dict[str, Any], document: str) -> tuple[dict[str, Any], str | None]:
    if subset == "general":
        label = str(row["hallucination"]).strip().lower()
        gold = {
            "user_query": row["user_query"], "reference_response": row["chatgpt_response"],
            "hallucination": label, "hallucination_spans": list(row.get("hallucination_spans") or []),
        }
        # Only a response labelled faithful may be imitated.
        return gold, (f"Answer: {row['chatgpt_response']}" if label == "no" else None)
    if subset == "summarization":
        gold = {"knowledge": document, "right_answer": row["right_summary"],
                "hallucinated_answer": row["hallucinated_summary"]}
        return gold, f"Summary: {row['right_summary']}"
    right_key, hallu_key, ask_key = (
        ("right_answer", "hallucinated_answer", "question") if subset == "qa"
        else ("right_response", "hallucinated_response", "dialogue_history")
    )
    gold = {"knowledge": row["knowledge"], ask_key: row[ask_key], "right_answer": row[right_key],
            "hallucinated_answer": row[hallu_key]}
    evidence = best_sentence(row["knowledge"], row[right_key])
    return gold, f"Answer: {row[right_key]}\nEvidence: {evidence}"


def _row_id(subset: str, row: dict[str, Any]) -> str:
    if subset == "general":
        return str(row["ID"])
    keys = {"qa": ("knowledge", "question"), "dialogue": ("knowledge", "dialogue_history"),
            "summarization": ("document",)}[subset]
    return content_id(*(str(row[k]) for k in keys))


def recognition_sample(
    row: dict[str, Any], subset: str, *, task: str, template: str, system_prompt: str | None, max_doc_chars: int,
    seed: int,
) -> tuple[Sample, bool]:
    """One HaluEval row of `subset` (qa | dialogue | summarization | general) as a recognition Sample (see the module
    docstring), and whether its document was cut."""
    fields = dict(row)
    truncated = False
    if subset == "summarization":
        fields["document"], truncated = cut(str(row["document"]), max_doc_chars)
    row_id = _row_id(subset, row)
    if subset == "general":
        label = str(row["hallucination"]).strip().lower()
        if label not in ("yes", "no"):
            raise ValueError(f"hallucination={row['hallucination']!r} is not yes / no")
        shown = str(row["chatgpt_response"])
    else:
        label = "yes" if random.Random(f"{seed}:{row_id}").random() < 0.5 else "no"
        shown = str(row[_PAIR[subset][label == "yes"]])
    fields["shown_answer"] = shown
    name = f"{subset}_recognition"
    messages: list[dict[str, str]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": fill_template(template, fields, f"HaluEval {name}")})
    gold = {"subset": name, "hallucination": label, "shown_answer": shown, "format": "answer"}
    target = f"Answer: {'Yes' if label == 'yes' else 'No'}"
    sample = Sample(task=task, id=f"halueval/{name}/{row_id}", messages=tuple(messages), gold=gold,
                    meta={"subset": name, "truncated": truncated, "choices": 2}, target=target)
    return sample, truncated


def halueval_sample(
    row: dict[str, Any], subset: str, *, task: str, template: str, system_prompt: str | None, max_doc_chars: int
) -> tuple[Sample, bool]:
    """One HaluEval row as a Sample, and whether its document was cut."""
    fields = dict(row)
    truncated = False
    if subset == "summarization":
        fields["document"], truncated = cut(str(row["document"]), max_doc_chars)
    gold, target = _gold_and_target(subset, row, fields.get("document", ""))
    gold.update(subset=subset, format=FORMAT_OF[subset])
    messages: list[dict[str, str]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": fill_template(template, fields, f"HaluEval {subset}")})
    sample = Sample(task=task, id=f"halueval/{subset}/{_row_id(subset, row)}", messages=tuple(messages),
                    gold=gold, meta={"subset": subset, "truncated": truncated}, target=target)
    return sample, truncated


def label_quota(limit: int) -> int:
    """The most rows of one label a balanced recognition subset keeps under `limit` (half, rounded up)."""
    return (limit + 1) // 2


def _read_samples(read, subset: str, sample_of, limit: int | None, quota: int | None) -> LoadResult:
    """The samples of `read`'s rows in file order (a row lacking its subset's fields, or that `sample_of` cannot
    build, rejected with its line), at most `limit`, at most `quota` of each general_recognition label."""
    result, seen_ids = LoadResult(), set()
    taken: dict[str, int] = {"yes": 0, "no": 0}
    for line, row in read.rows:
        if limit is not None and len(result.samples) >= limit:
            break
        if quota is not None and taken.get(str(row.get("hallucination", "")).strip().lower(), 0) >= quota:
            continue
        missing = missing_fields(row, SUBSET_FIELDS[subset])
        if missing:
            read.reject(line, f"missing {subset} fields {missing}")
            continue
        try:
            sample = sample_of(row)
        except TemplateFieldError:
            raise
        except (KeyError, ValueError, TypeError, IndexError) as err:
            read.reject(line, f"{type(err).__name__}: {err}")
            continue
        # A repeated id keeps its row but gets the line appended: ids must stay unique for the split and logs.
        new_id = f"{sample.id}@line{line}" if sample.id in seen_ids else sample.id
        seen_ids.add(new_id)
        if quota is not None:
            taken[sample.gold["hallucination"]] += 1
        result.samples.append(replace(sample, id=new_id, meta={**sample.meta, "source": read.path, "line": line}))
    return result


def load_halueval(
    path: str | Path,
    subset: str | None = None,
    task: str = "hallucination",
    limit: int | None = None,
    max_doc_chars: int = DEFAULT_MAX_DOC_CHARS,
    system_prompt: str | None = None,
    template: str | None = None,
    seed: int = 0,
) -> LoadResult:
    """Samples from one HaluEval file (JSON lines, a JSON array, or concatenated objects).

    subset: "qa" | "dialogue" | "summarization" | "general", or a recognition subset "<one of those>_recognition"
    (seed: which answer each row shows); None = detected from the first good row's fields.
    limit: keep the first `limit` good rows (file order); general_recognition takes at most label_quota(limit) of
    each label, so its rows are balanced "yes" / "no" (fewer than `limit` when the file runs short of one label; no
    limit: every row). A row lacking its subset's fields is warned and skipped;
    a file with no usable row at all (not JSON, or no row with the subset's fields) raises DataFileError.
    """
    if subset is not None and subset not in SUBSET_FIELDS and subset not in RECOGNITION:
        raise ValueError(f"HaluEval subset={subset!r}: use one of {sorted(SUBSET_FIELDS) + sorted(RECOGNITION)} "
                         "or None to detect it")
    recognition = RECOGNITION.get(subset or "")
    if recognition:
        subset = recognition
    read = read_records(path)
    if subset is None:
        subset = next((s for _, row in read.rows if (s := detect_subset(row))), None)
        if subset is None:
            read.finish()
            raise ValueError(f"{path}: no row has the fields of any HaluEval subset {SUBSET_FIELDS}")
    tmpl = (RECOGNITION_TEMPLATES if recognition else HALUEVAL_TEMPLATES)[subset] if template is None else template

    def sample_of(row: dict) -> Sample:
        if recognition:
            return recognition_sample(row, subset, task=task, template=tmpl, system_prompt=system_prompt,
                                      max_doc_chars=max_doc_chars, seed=seed)[0]
        return halueval_sample(row, subset, task=task, template=tmpl, system_prompt=system_prompt,
                               max_doc_chars=max_doc_chars)[0]

    # general_recognition with a limit keeps its labels balanced (general is 815 "yes" to 3,692 "no": a reward for
    # plain accuracy on the first rows would pay answering "No" to everything): half the rows of each label.
    quota = label_quota(limit) if recognition and subset == "general" and limit is not None else None
    result = _read_samples(read, subset, sample_of, limit, quota)
    read.finish()
    if not result.samples:
        # A file that gives no sample would silently drop its whole subset (or task) from the run.
        first = f" (first: {read.problems[0]})" if read.problems else ""
        raise DataFileError(f"{read.path}: no usable HaluEval {subset} row{first}; fix the file or remove it from "
                            "the configured subsets")
    result.skipped = read.skipped
    return result
