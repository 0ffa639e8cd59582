"""TRL's surface: a GRPOConfig, `trl grpo`'s config file and flags, and the run's advice in TRL's words. The tables of
TRL's four records (GRPOConfig's TABLE with its rules; GRPOScriptArguments', ModelConfig's and DatasetMixtureConfig's;
the rows' shared machinery) translate a TRL configuration into grpo-dual's config tree (translation.py,
command_line.py); a TRL command line's dataset is written as row files (row_files.py); the advice names the TRL fields
that set what it advises (vocabulary.py); a step's metrics get TRL's log keys (log_keys.py); docs/TRL.md is generated
from the tables (`python -m grpo.run.trl.docs`). This wing imports no other wing."""

from .command_line import read_config_file, trl_flags
from .grpo_config import GRPOConfig
from .log_keys import trl_log_keys
from .translation import from_trl
from .vocabulary import error_in_user_terms

__all__ = ["GRPOConfig", "error_in_user_terms", "from_trl", "read_config_file", "trl_flags", "trl_log_keys"]
