"""decoding: the one sampler (next_token), the lean loop, the graph engine, the one-token forwards and the keyed
draw; the rollouts call it."""
