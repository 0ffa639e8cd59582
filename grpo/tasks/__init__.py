"""Task loaders: BBQ, HaluEval, generic JSONL / `datasets` files. `grpo.data` is the entry point."""
