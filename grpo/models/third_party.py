"""The warnings of the libraries grpo-dual drives that say nothing to its user, filtered one by one.

Each entry of QUIET names one warning by its category, the module that issues it and the start of its message: a
deprecation inside a library's call into another (peft asking transformers for a renamed attribute), or about a
field TRL's own default sets (GRPOConfig's gradient_checkpointing, renamed in transformers). Nothing else is
filtered: the same category from another module, or another message of the same module, is shown as before, and so is
every warning of grpo-dual's own code. Standard library only.
"""

from __future__ import annotations

import re
import warnings

__all__ = ["quiet_third_party"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""

QUIET: tuple[tuple[type[Warning], str, str], ...] = (
    # transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16's GRPOConfig still sets the
    # old field (its default, True), so every GRPOConfig warns, whatever the user wrote
    (FutureWarning, "transformers.training_args", "`gradient_checkpointing` is deprecated"),
    # peft asks every model for the old attribute when it wraps it (peft_model.py), whatever the user set
    (FutureWarning, "transformers.modeling_utils", "`is_gradient_checkpointing` is deprecated"),
)
"""(category, issuing module, start of the message) of each warning filtered: what says nothing to the user."""


def quiet_third_party() -> None:
    """Install QUIET's filters (idempotent: warnings.filterwarnings drops an identical filter before adding it)."""
    for category, module, message in QUIET:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category, module=re.escape(module) + "$")
