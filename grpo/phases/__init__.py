"""The phases of a run besides the RL step's own: the held-out evaluation, the pass@K diagnostic and the SFT warm-up
(the step's phases, generate / batch / update, are called by its owners in grpo/run/step_owners.py)."""

from grpo.phases.coverage import pass_at_k_eval
from grpo.phases.evaluation import evaluate, part_means, record_measures, unscored
from grpo.phases.sft import run_sft, sft_examples, stratified

__all__ = ["evaluate", "part_means", "pass_at_k_eval", "record_measures", "run_sft", "sft_examples", "stratified",
           "unscored"]
