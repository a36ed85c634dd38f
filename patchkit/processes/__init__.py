"""Every process: the start-up hook (:mod:`.autoload`), manifests (:mod:`.manifest`), the
cross-process consistency check (:mod:`.consistency`), the ``patchkit run`` launcher
(:mod:`.launcher`) and Ray helpers (:mod:`.ray`)."""
