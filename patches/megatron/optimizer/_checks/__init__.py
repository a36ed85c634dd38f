"""Self-checks of the optimizer patches (``patchkit doctor``): one module per patch, named after it."""
