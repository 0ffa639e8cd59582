"""`python check_gpu_memory.py [--estimate ...]`: the installed command `grpo-check-gpu-memory`, run from a checkout.

A thin entry point: the tool is grpo/run/assembly/gpu_memory_check.py (`--help` lists its options).
"""

import sys

from grpo.run.assembly.gpu_memory_check import check_gpu_memory

if __name__ == "__main__":
    sys.exit(check_gpu_memory())
