"""A GRPOConfig of grpo-dual's own, for a script where TRL is not installed: TRL 1.16's field names and defaults for
every field grpo-dual translates (TABLE, grpo/run/trl/config_table.py), as a dataclass a script builds as it builds
TRL's (`GRPOConfig(output_dir=..., learning_rate=...)`) and `GRPOTrainer(args=...)` / `train(args=...)` take.

With TRL installed a script keeps `from trl import GRPOConfig`: TRL's object is read field by field as this one is."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from grpo.run.trl.config_table import TABLE


def _field(default: Any) -> Any:
    if isinstance(default, (list, dict)):  # a mutable default gets a fresh copy per object, as TRL's fields do
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default))
    return dataclasses.field(default=default)


GRPOConfig = dataclasses.make_dataclass(
    "GRPOConfig", [(row.trl, Any, _field(row.default)) for row in TABLE],
    namespace={"__doc__": "TRL 1.16's GRPOConfig fields that grpo-dual translates, with TRL's defaults (docs/TRL.md); "
                          "a field TRL has beyond these is not here: with TRL installed, use trl.GRPOConfig.",
               "to_dict": lambda self: dataclasses.asdict(self)})
GRPOConfig.__module__ = __name__
