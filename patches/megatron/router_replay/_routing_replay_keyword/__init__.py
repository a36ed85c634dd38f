"""Implementation of ``megatron.routing_replay_keyword``: one module per release span and the keyword
alias they share."""
