"""decoding: the lean loop, the graph engine, the one-token steps and the keyed sampling; the rollouts call it."""
