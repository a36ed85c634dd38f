"""Self-checks of the gradient-communication patches."""
