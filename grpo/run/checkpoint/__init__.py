"""What a run keeps on disk and goes on from: crash-safe checkpoint files with a manifest of sha256 (files, their state
as safetensors + JSON by treecodec), what a checkpoint holds and how a run saves and resumes it (resume), the input
fingerprints a resume compares (fingerprints), the run folder and the final model's folder (folder), the Pareto
frontier of evaluated checkpoints (pareto) and the best evaluated model with early stopping (best_model)."""
from .best_model import keep_if_best, settle_best, stops_early
from .files import CheckpointError, save_reference
from .fingerprints import input_fingerprints
from .folder import (check_final_model_dir, discarded_if_unstarted, expand_home, prepare_run_dir, publish_final,
                     release_run_dir)
from .pareto import RUN_SUBDIR, ParetoFrontier, check_evaluations, require_heldout_rows
from .save_resume import (FinalSaveError, check_resume, last_checkpoint_line, reference_weights, restore_best, resume,
                          save_checkpoint, save_final_checkpoint, save_final_model)

__all__ = [
    "RUN_SUBDIR", "CheckpointError", "FinalSaveError", "ParetoFrontier", "check_evaluations", "check_final_model_dir",
    "check_resume", "discarded_if_unstarted", "expand_home", "input_fingerprints", "keep_if_best",
    "last_checkpoint_line", "prepare_run_dir", "publish_final", "reference_weights", "release_run_dir",
    "require_heldout_rows", "restore_best", "resume", "save_checkpoint", "save_final_checkpoint", "save_final_model",
    "save_reference", "settle_best", "stops_early",
]
