"""Self-checks of the GPTModel patches (``patchkit doctor``): one module per patch, named after it."""
