"""The benchmarks: each module runs from the checkout's root as `python -m benchmarks.<name>` (benchmarks/RESULTS.md
keeps each command beside its figures)."""
