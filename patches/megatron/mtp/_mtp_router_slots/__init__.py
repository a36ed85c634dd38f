"""Implementation of ``megatron.mtp_router_slots``: one module per release span, named by its first release."""
