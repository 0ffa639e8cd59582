"""What a run keeps on disk and goes on from: crash-safe checkpoint files with a manifest of sha256 (files, their state
as safetensors + JSON by treecodec), what a checkpoint holds and how a run saves and resumes it (save_resume), the
input fingerprints a resume compares (fingerprints), the run folder and the final model's folder (folder), the Pareto
frontier of evaluated checkpoints (pareto), the best evaluated model with early stopping (best_model), a model saved
as a folder that loads anywhere with its card (model_folder, model_card) and TRL's output_dir/checkpoint-N folders
(trl_folders)."""

from grpo.run.checkpoint.best_model import offer_evaluation, offer_final_point, settle_best, stops_early
from grpo.run.checkpoint.files import CheckpointError, exact_checkpoint, optional_write, save_reference
from grpo.run.checkpoint.folder import (
    discarded_if_unstarted,
    expand_home,
    prepare_run_dir,
    publish_final,
    release_run_dir,
)
from grpo.run.checkpoint.model_folder import save_model_folder
from grpo.run.checkpoint.resume_line import note_command_line, resume_advice
from grpo.run.checkpoint.save_resume import (
    FinalSaveError,
    check_resume,
    last_checkpoint_line,
    reference_weights,
    resume,
    save_checkpoint,
    save_final_checkpoint,
    save_final_model,
    write_final_cards,
)

__all__ = ["CheckpointError", "FinalSaveError", "check_resume", "discarded_if_unstarted", "exact_checkpoint",
           "expand_home", "last_checkpoint_line", "note_command_line", "offer_evaluation", "offer_final_point",
           "optional_write", "prepare_run_dir", "publish_final", "reference_weights", "release_run_dir", "resume",
           "resume_advice", "save_checkpoint", "save_final_checkpoint", "save_final_model", "save_model_folder",
           "save_reference", "settle_best", "stops_early", "write_final_cards"]
