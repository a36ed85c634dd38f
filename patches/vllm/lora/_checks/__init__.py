"""Self-check of ``vllm.lora_from_tensors`` and the tiny LoRA model it shares with ``tests/vllm``."""
