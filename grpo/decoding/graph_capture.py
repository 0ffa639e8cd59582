"""Compiling and capturing a decoding step over fixed buffers (the graph engine's, grpo/decoding/graph_decode.py).

    compile   torch.compile(step, fullgraph=True) with a backend that counts its compiles (`counting_backend`):
              (the graph engine compiles on a stand-in whose rows and columns are dynamic: one graph for every shape)
    capture   on CUDA, a CUDA graph of one call of the step (`Captured`): its kernels and their fixed addresses, so a
              replay is one launch; the buffers stay where they are and a new rollout writes into them

Every graph of one engine shares one memory pool: a step keeps nothing between calls (it writes its results into the
state's buffers), so what one graph's kernels allocate is dead when the next graph runs, and the pool holds the
largest step's temporaries instead of the sum of every shape's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

import torch


def counting_backend(name: str, counts: Counter) -> Callable[..., Any]:
    """The torch.compile backend `name` ("inductor", "eager", ...), counting each graph it compiles in
    counts["compiles"]."""
    from torch._dynamo import lookup_backend

    inner = lookup_backend(name)

    def backend(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        counts["compiles"] += 1
        return inner(graph_module, example_inputs)

    return backend


class Captured:
    """A CUDA graph of one call of `fn(state)`, captured after warm-up calls on a side stream (the compiled code
    allocates its workspace there). The warm-up changes `mutable` (every tensor the step writes that the first real
    call reads); they are put back as they were, whether the capture succeeds or raises. The KV buffers need no copy:
    a step writes its column before it attends to it, and the columns after it are masked."""

    def __init__(self, fn: Callable[[Any], None], state: Any, mutable: Sequence[torch.Tensor | None],
                 pool: Any = None, warmup: int = 2):
        self.graph = torch.cuda.CUDAGraph()
        kept = [x for x in mutable if x is not None]
        snapshot = [x.clone() for x in kept]
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    fn(state)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(self.graph, pool=pool):
                fn(state)
        finally:
            # the warm-up calls ran (a capture runs nothing): undo them
            for x, saved in zip(kept, snapshot, strict=True):
                x.copy_(saved)

    def __call__(self, state: Any) -> None:
        self.graph.replay()
