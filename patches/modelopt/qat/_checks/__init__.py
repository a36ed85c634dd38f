"""Self-checks of the ModelOpt patches, one module per patch (run by ``patchkit doctor``), and their drivers."""
