"""The version of patchkit, in a leaf module: what a manifest records, without importing the package."""

__version__ = "0.1.0"

#: The distribution that installs the import package ``patchkit`` (``pip install patchkit-rl``).
#: The name ``patchkit`` on the package index is an unrelated project.
DISTRIBUTION_NAME = "patchkit-rl"
