"""Self-checks of the refit patches, one module per patch, each a short case run through one driver
(``_round_trip``), and the checkpoints and layers they share with ``tests/vllm`` (``_mxfp8``,
``_mxfp4_moe``, ``_fp8_checkpoint``, ``_ct_nvfp4_checkpoint``).
"""
