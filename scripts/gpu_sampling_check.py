"""GPU check of batch-invariant sampling (grpo/models/sampling.py): the hashed uniforms are bit-identical on CPU and CUDA,
and the per-step cost of the inverse-CDF draw at a Qwen-sized vocabulary. Prints figures; needs a CUDA GPU.

    python scripts/gpu_sampling_check.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo.models.sampling import inverse_cdf_choice, row_keys, uniforms  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 1
    keys = torch.tensor(row_keys(0, 3, range(16), 4))
    same = all(torch.equal(uniforms(keys, t, 1), uniforms(keys.cuda(), t, 1).cpu()) for t in range(64))
    print(f"GPU: {torch.cuda.get_device_name()}; uniforms identical on CPU and CUDA for 64 steps x 64 rows: {same}")
    scores = torch.randn(64, 151936, device="cuda", dtype=torch.bfloat16)
    for label, fn in [("inverse-CDF draw (ours)", lambda t: inverse_cdf_choice(scores, keys.cuda(), t)),
                      ("softmax + multinomial (HF)", lambda t: torch.multinomial(torch.softmax(scores.float(), -1), 1))]:
        fn(0)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for t in range(100):
            fn(t)
        torch.cuda.synchronize()
        print(f"{label}: {(time.perf_counter() - start) * 10:.3f} ms per decoding step at 64 x 151936")
    return 0 if same else 2


if __name__ == "__main__":
    sys.exit(main())
