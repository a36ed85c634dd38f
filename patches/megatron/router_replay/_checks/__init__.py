"""Self-checks of the router replay patches (``patchkit doctor``): one module per patch, named after it."""
