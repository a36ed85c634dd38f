"""Self-checks of the distributed-checkpointing patches: checkpoint round trips on a one-rank gloo group."""
