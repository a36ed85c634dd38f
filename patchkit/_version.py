"""The version of patchkit, in a leaf module: what a manifest records, without importing the package."""

__version__ = "0.1.0"
