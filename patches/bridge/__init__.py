"""Patches for bridge."""
