"""``megatron.ddp_buffers_without_cpu_backup``: ``regions`` holds the keywords, the request and the
allocation hook every release shares; ``v014`` / ``v019`` name upstream's shared-buffer test."""
