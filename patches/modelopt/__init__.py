"""Patches for modelopt."""
