"""A thin entry point kept where users look for it: the configuration is the package `grpo.config`.

`import config` here (from the checkout) is that package itself, so `config.Config`, `config.load_config(...)` and
every other name work as before; installed code imports `grpo.config`.
"""

import sys

import grpo.config

sys.modules[__name__] = grpo.config
