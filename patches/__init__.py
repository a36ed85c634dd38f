"""The patch catalogue, shipped as ``patchkit.patches``."""
