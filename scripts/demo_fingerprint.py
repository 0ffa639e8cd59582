"""Fingerprint of a finished run folder, to check that a refactor left the training bit-identical.

    python grpo_train.py --seed 0 --output-dir /tmp/runs --run-name base     # before the change
    python -m scripts.demo_fingerprint /tmp/runs/base > before.json
    ... change the code, run again as `after` ...
    python -m scripts.demo_fingerprint /tmp/runs/after > after.json && diff before.json after.json

Covers every value of metrics.jsonl except the measured ones (clock and memory readings: MEASURED_PREFIXES), eval.json,
the sampled completions (samples/*.jsonl) and the sha256 of every final/*.safetensors file. The last line is one sha256
over all of it.
Exact equality (repr of every float): meant for the same machine and the same torch build.

A refactor that moves a module a grader lives in renames that grader (its spec `package.module:function` is its name in
metric keys and in the samples), and nothing else; `--rename NEW=OLD` (repeatable) writes NEW as OLD everywhere
before the fingerprint is taken, so the two fingerprints compare what the run computed:

    python -m scripts.demo_fingerprint /tmp/runs/after --rename grpo.data.demo_tasks=grpo.demo_tasks
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from grpo.run.tracking import MEASURED_PREFIXES

ROOT = Path(__file__).resolve().parents[1]


def is_timing(key: str) -> bool:
    return key.startswith(MEASURED_PREFIXES)


def renamed(text: str, renames: dict[str, str]) -> str:
    for new, old in renames.items():
        text = text.replace(new, old)
    return text


def fingerprint(run_dir: Path, renames: dict[str, str] | None = None) -> dict:
    """Everything deterministic a run wrote, as one JSON-able dict (`renames`: NEW -> OLD, applied to the metric
    names and the samples' text first)."""
    renames = renames or {}
    metrics = []
    for line in renamed((run_dir / "metrics.jsonl").read_text(), renames).splitlines():
        if line.strip():
            row = json.loads(line)
            metrics.append({k: v for k, v in row.items() if not is_timing(k)})
    samples = {p.name: hashlib.sha256(renamed(p.read_text(), renames).encode()).hexdigest()
               for p in sorted((run_dir / "samples").glob("*.jsonl"))}
    weights = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted((run_dir / "final").glob("*.safetensors"))}
    if not weights:
        raise SystemExit(f"{run_dir}/final holds no *.safetensors: is the run finished?")
    return {"metrics": metrics, "eval": json.loads((run_dir / "eval.json").read_text()), "samples": samples,
            "weights": weights}


def main(argv: list[str]) -> int:
    renames: dict[str, str] = {}
    while len(argv) >= 3 and argv[-2] == "--rename" and "=" in argv[-1]:
        new, old = argv[-1].split("=", 1)
        renames[new] = old
        argv = argv[:-2]
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    fp = fingerprint(Path(argv[0]), renames)
    text = json.dumps(fp, indent=1, sort_keys=True)
    print(text)
    print(f"fingerprint sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
