"""Self-checks of the parallel-state patches (``patchkit doctor``): one module per patch, named after it."""
