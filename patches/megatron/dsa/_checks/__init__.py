"""Self-checks of the DSA patches (``patchkit doctor``): one module per patch, named after it."""
