"""Implementation of ``megatron.router_replay``: the 0.16 ``RouterReplay`` backport and the 0.14/0.15 router wraps."""
