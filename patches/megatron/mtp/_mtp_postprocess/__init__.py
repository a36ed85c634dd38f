"""Implementation of ``megatron.mtp_postprocess``: one module per release span (named by its first
release) and the parts they share."""
