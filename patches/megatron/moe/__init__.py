"""MoE layers: patches of the token dispatchers and expert MLPs that are not about router replay.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
