"""Self-checks of the MoE patches (``patchkit doctor``): one module per patch, named after it."""
