"""Self-checks of the gradient- and pipeline-communication patches."""
