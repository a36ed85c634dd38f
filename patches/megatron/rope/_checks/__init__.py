"""Self-checks of the rotary embedding patches (``patchkit doctor``): one module per patch, named after it."""
