"""The assembly of a run: its command line and config checked, this process prepared, its inputs tried before the
folder or the model, the start's checks (no-op settings, LoRA targets, the output folder, the disk), the model and
the choices that need it, the prompts fitted, the owners built, the banner. `grpo_train.setup` calls these in order.
The memory estimate's inputs and the `grpo-check-gpu-memory` command live here too."""

from grpo.models.pretrained import ModelPackageMissing
from grpo.run.assembly.config_check import check_config, parse_command_line
from grpo.run.assembly.console import banner, preset_note, template_less, template_note, warm_up
from grpo.run.assembly.inputs import CheckedInputs, check_inputs
from grpo.run.assembly.model_loading import (
    check_model_available,
    check_precision,
    check_sharding,
    choose_graph_memory,
    policy_from_config,
)
from grpo.run.assembly.owners import build_owners
from grpo.run.assembly.process import prepare_process, processes, relaunch_if_asked, seed_everything
from grpo.run.assembly.samples import fit_prompts, with_epochs
from grpo.run.assembly.start_checks import check_start

__all__ = ["CheckedInputs", "ModelPackageMissing", "banner", "build_owners", "check_config", "check_inputs",
           "check_model_available", "check_precision", "check_sharding", "check_start", "choose_graph_memory",
           "fit_prompts", "parse_command_line", "policy_from_config", "prepare_process", "preset_note", "processes",
           "relaunch_if_asked", "seed_everything", "template_less", "template_note", "warm_up", "with_epochs"]
