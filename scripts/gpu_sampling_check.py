"""GPU check of batch-invariant sampling (grpo/decoding/sampling.py): the hashed uniforms are bit-identical on CPU and
CUDA, the race picks the same tokens on both and compiled, and the per-step cost of the draw at a Qwen-sized vocabulary,
eager and compiled. Prints figures; needs a CUDA GPU.

    python -m scripts.gpu_sampling_check
"""

from __future__ import annotations

import sys
import time

import torch

from grpo.decoding.sampling import keyed_choice, row_keys, uniforms


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 1
    keys = torch.tensor(row_keys(0, 3, range(16), 4))
    same = all(torch.equal(uniforms(keys, t, 4096), uniforms(keys.cuda(), t, 4096).cpu()) for t in range(64))
    print(f"GPU: {torch.cuda.get_device_name()}; uniforms identical on CPU and CUDA for 64 steps x 64 rows: {same}")
    scores = torch.randn(64, 151936, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(keyed_choice, fullgraph=True)
    picks = [keyed_choice(scores.cpu(), keys, 7), keyed_choice(scores, keys.cuda(), 7).cpu(),
             compiled(scores, keys.cuda(), torch.tensor(7, device="cuda")).cpu()]
    agree = [int((p == picks[0]).sum()) for p in picks[1:]]
    print(f"tokens equal to the CPU's, of 64 rows: CUDA eager {agree[0]}, CUDA compiled {agree[1]}")
    ways = [("race, eager (ours)", lambda t: keyed_choice(scores, keys.cuda(), t)),
            ("race, compiled (ours)", lambda t: compiled(scores, keys.cuda(), torch.tensor(t, device="cuda"))),
            ("softmax + multinomial (HF)", lambda t: torch.multinomial(torch.softmax(scores.float(), -1), 1))]
    for label, fn in ways:
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
