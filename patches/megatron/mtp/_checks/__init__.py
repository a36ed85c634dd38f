"""Self-checks of the MTP patches (``patchkit doctor``): one module per patch, named after it."""
