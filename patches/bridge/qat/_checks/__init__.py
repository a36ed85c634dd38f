"""Self-checks of the QAT patches (``patchkit doctor``): one module per patch, named after it."""
