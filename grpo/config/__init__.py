"""The one typed configuration of grpo-dual: `from grpo import config as C`, then `C.Config`, `C.LossConfig`,
`C.load_config(...)`, `C.ConfigError`, ... are the one way in. The section dataclasses, their field docstrings and
their checks are grpo/config/sections.py's (the whole `Config`; train, sft, judge, checkpoint),
grpo/config/input_sections.py's (model, data, tasks.<task>, reward_models.<name>) and
grpo/config/algorithm_sections.py's (rollout, loss, kl.<task>, multi); `ConfigError`, the field checks and the bounds
grpo/config/checks.py's; the Config built from presets, overrides (`load_config("demo", ["rollout.k=8",
"kl.fairness.beta=0.2", "rewards.fairness=bbq_rule:1,format:0.2"])`) and config files, and back,
grpo/config/building.py's; the presets grpo/config/presets.py's, the command line (`--rollout.k 8`,
`--set rollout.k=8`, --help) grpo/config/command_line.py's. Standard library only.
"""

from grpo.config.algorithm_sections import LossConfig, MultiConfig, RolloutConfig, TaskKLConfig, check_clip
from grpo.config.building import (
    DICT_SECTIONS,
    MAX_FLOAT_INT,
    asdict_section,
    coerce_value,
    config_tree,
    dumps,
    from_dict,
    load_config,
    parse_value,
    to_dict,
)
from grpo.config.checks import (
    ENV_NAME,
    JUDGE_RATE_MAX_STEP_S,
    KEY_PREFIXES,
    LLAMA_LORA_TARGETS,
    LOGIT_BOUND,
    MAX_LOGIT_PENALTY,
    MAX_LOSS_WEIGHT,
    MAX_LR,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MIN_TEMPERATURE,
    SHARED_PROMPT_MODES,
    TINY_MIN_VOCAB,
    ConfigError,
    field_error,
)
from grpo.config.input_sections import (
    BUILTIN_SOURCES,
    PROMPT_FORMATS,
    DataConfig,
    ModelConfig,
    RewardModelConfig,
    TaskSourceConfig,
)
from grpo.config.presets import DEMO_KL, PRESETS
from grpo.config.sections import LR_SCHEDULERS, CheckpointConfig, Config, JudgeConfig, SFTConfig, TrainConfig
from grpo.core.plumbing import did_you_mean

__all__ = [
    "BUILTIN_SOURCES", "DEMO_KL", "DICT_SECTIONS", "ENV_NAME", "JUDGE_RATE_MAX_STEP_S", "KEY_PREFIXES",
    "LLAMA_LORA_TARGETS", "LOGIT_BOUND", "LR_SCHEDULERS", "MAX_FLOAT_INT", "MAX_LOGIT_PENALTY", "MAX_LOSS_WEIGHT",
    "MAX_LR", "MAX_REPETITION_PENALTY", "MAX_SEED", "MIN_TEMPERATURE", "PRESETS", "PROMPT_FORMATS",
    "SHARED_PROMPT_MODES", "TINY_MIN_VOCAB", "CheckpointConfig", "Config", "ConfigError", "DataConfig", "JudgeConfig",
    "LossConfig", "ModelConfig", "MultiConfig", "RewardModelConfig", "RolloutConfig", "SFTConfig", "TaskKLConfig",
    "TaskSourceConfig", "TrainConfig", "asdict_section", "check_clip",
    "coerce_value", "config_tree", "did_you_mean", "dumps", "field_error", "from_dict", "load_config", "parse_value",
    "to_dict",
]
