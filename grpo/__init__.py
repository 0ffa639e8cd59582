"""grpo-dual: GRPO / GSPO reinforcement-learning fine-tuning for causal LMs, with per-task KL control."""
