"""A thin entry point kept where users look for it: the configuration lives in grpo/config/settings.py.

`import config` here (from the checkout) is that module itself, so `config.Config`, `config.load_config(...)` and
every other name work as before; installed code imports `grpo.config.settings`.
"""

import sys

from grpo.config import settings

sys.modules[__name__] = settings
