"""A TRL script's import order on a CPU: the same short demo run with TRL (and so torch and its OpenMP runtime)
imported before grpo_train, and with grpo_train imported first.

    python -m benchmarks.import_order trl-first|grpo-first [--out DIR] [-- trainer arguments]

`trl-first` does what every TRL script does (`from trl import GRPOConfig, GRPOTrainer`, then grpo_train); torch then
loads libgomp before grpo_train's `quiet_openmp` can ask its idle threads to sleep, so they spin. `grpo-first` imports
grpo_train first. Time each as a whole process, alternating the two (A B A B ...), idle and beside a busy process
(`python -c "while True: pass"`); the figures are in benchmarks/RESULTS.md, "Import order". Nothing runs at import.
"""

from __future__ import annotations

import sys
import tempfile

RUN_ARGS = ("--preset", "demo", "--seed", "0", "--max-steps", "3", "--sft.steps", "10")
"""What is timed: the demo's first 3 RL steps after a 10-step SFT warm-up, its evaluations included."""


def main(argv: list[str]) -> int:
    order, rest = (argv[0] if argv else ""), argv[1:]
    if order not in ("trl-first", "grpo-first"):
        raise SystemExit("usage: python -m benchmarks.import_order trl-first|grpo-first [--out DIR] [-- args]")
    out = rest[rest.index("--out") + 1] if "--out" in rest else tempfile.mkdtemp(prefix="import-order-")
    extra = rest[rest.index("--") + 1:] if "--" in rest else []
    if order == "trl-first":
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (TRL's script order: torch loads here)
    import grpo_train

    return grpo_train.cli([*RUN_ARGS, "--train.output_dir", out, "--overwrite", *extra])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
