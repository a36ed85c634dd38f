"""Self-checks of the ModelOpt patches that belong to no family, one module per patch (run by ``patchkit doctor``)."""
