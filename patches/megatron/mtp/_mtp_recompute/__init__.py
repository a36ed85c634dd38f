"""Implementation of ``megatron.mtp_recompute``: one module per release span, named by its first release."""
