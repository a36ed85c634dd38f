"""Self-checks of the attention patches (``patchkit doctor``): one module per patch, named after it."""
