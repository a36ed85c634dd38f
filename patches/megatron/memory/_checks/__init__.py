"""Self-checks of the memory patches (``patchkit doctor``): one module per patch, named after it."""
