# ruff: noqa: E501
"""The catalogue's index, generated from the declaration modules by `patchkit matrix catalogue`: do not edit.

Read at start-up by patchkit.runtime.catalogue; patchkit.matrix.catalogue_index says what each constant holds.
"""

FORMAT = 2

FOLDERS = {
    '': ('bridge', 'entry_points.py', 'megatron', 'modelopt', 'vllm'),
    'bridge': ('qat', 'save_hf_adapter.py', 'signal_handler_main_thread.py'),
    'bridge.qat': ('expert_local_to_global.py', 'expert_sort_key.py', 'modelopt_layer_spec.py', 'quant_linear_parallelism.py', 'skip_quantizer_params.py'),
    'megatron': ('dist_checkpointing', 'gpt', 'memory', 'moe', 'mtp', 'parallel', 'rope', 'router_replay'),
    'megatron.dist_checkpointing': ('dist_ckpt_async_queue_reset.py', 'dist_ckpt_blocking_d2h.py', 'dist_ckpt_partial_load.py', 'dist_ckpt_safe_load.py'),
    'megatron.gpt': ('output_processor.py',),
    'megatron.memory': ('tms_hook_mode.py',),
    'megatron.moe': ('moe_expert_load_metrics.py', 'moe_recompute_release.py', 'swiglu_singleton_local_shards.py'),
    'megatron.mtp': ('mtp_detach_inputs.py', 'mtp_postprocess.py', 'mtp_recompute.py', 'mtp_router_slots.py'),
    'megatron.parallel': ('tp_group_if_none_helper.py',),
    'megatron.rope': ('mla_thd_cp_rope.py',),
    'megatron.router_replay': ('moe_alltoall_replay_token_count.py', 'router_replay.py', 'router_replay_validation.py', 'routing_replay_keyword.py'),
    'modelopt': ('max_calibrator_nan_safe.py', 'qat'),
    'modelopt.qat': ('nvfp4_cpu_fake_quant.py',),
    'vllm': ('lora', 'moe_expert_weight_loaders.py', 'nvfp4_marlin_w4a16.py', 'refit', 'serve_signals_main_thread.py', 'shm_broadcast_bind_retry.py'),
    'vllm.lora': ('lora_from_tensors.py',),
    'vllm.refit': ('compressed_tensors_nvfp4_moe_refit.py', 'compressed_tensors_nvfp4_refit.py', 'fp8_refit.py', 'mxfp4_moe_refit.py', 'mxfp8_refit.py', 'nvfp4_refit.py'),
}

DECLARATIONS = {
    'bridge.qat.expert_local_to_global': (('bridge.expert_local_to_global', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge.models.conversion.model_bridge', 'megatron.bridge'), ('megatron-bridge',)),),
    'bridge.qat.expert_sort_key': (('bridge.expert_sort_key', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge.models.conversion.model_bridge', 'megatron.bridge'), ('megatron-bridge',)),),
    'bridge.qat.modelopt_layer_spec': (('bridge.modelopt_layer_spec', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge', 'megatron.bridge.models.gpt_provider'), ('megatron-bridge',)),),
    'bridge.qat.quant_linear_parallelism': (('bridge.quant_linear_parallelism', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge.models.conversion.param_mapping', 'megatron.bridge'), ('megatron-bridge',)),),
    'bridge.qat.skip_quantizer_params': (('bridge.skip_quantizer_params', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge.models.conversion.model_bridge',), ('megatron-bridge',)),),
    'bridge.save_hf_adapter': (('bridge.save_hf_adapter', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge.models.conversion.auto_bridge', 'megatron.bridge'), ('megatron-bridge',)),),
    'bridge.signal_handler_main_thread': (('bridge.signal_handler_main_thread', False, (('megatron-bridge', 'megatron.bridge'),), ('megatron.bridge.training.utils.sig_utils', 'megatron.bridge'), ('megatron-bridge',)),),
    'megatron.dist_checkpointing.dist_ckpt_async_queue_reset': (('megatron.dist_ckpt_async_queue_reset', False, (('megatron-core', 'megatron.core'),), ('megatron.core.dist_checkpointing.strategies.async_utils',), ('megatron-core',)),),
    'megatron.dist_checkpointing.dist_ckpt_blocking_d2h': (('megatron.dist_ckpt_blocking_d2h', True, (('megatron-core', 'megatron.core'),), ('megatron.core.dist_checkpointing.strategies.filesystem_async',), ('megatron-core',)),),
    'megatron.dist_checkpointing.dist_ckpt_partial_load': (('megatron.dist_ckpt_partial_load', True, (('megatron-core', 'megatron.core'),), ('megatron.core.dist_checkpointing.strategies.torch',), ('megatron-core',)),),
    'megatron.dist_checkpointing.dist_ckpt_safe_load': (('megatron.dist_ckpt_safe_load', False, (('megatron-core', 'megatron.core'),), ('megatron.core.dist_checkpointing.strategies.common', 'megatron.core'), ('megatron-core',)),),
    'megatron.gpt.output_processor': (('megatron.output_processor', False, (('megatron-core', 'megatron.core'),), ('megatron.core.models.gpt.gpt_model', 'megatron.core'), ('megatron-core',)),),
    'megatron.memory.tms_hook_mode': (('megatron.tms_hook_mode', False, (('megatron-core', 'megatron.core'), ('torch-memory-saver', None)), ('megatron.core', 'torch_memory_saver.entrypoint'), ('megatron-core', 'torch-memory-saver')),),
    'megatron.moe.moe_expert_load_metrics': (('megatron.moe_expert_load_metrics', True, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.moe.router',), ('megatron-core',)),),
    'megatron.moe.moe_recompute_release': (('megatron.moe_recompute_release', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.moe.token_dispatcher',), ('megatron-core',)),),
    'megatron.moe.swiglu_singleton_local_shards': (('megatron.swiglu_singleton_local_shards', False, (('megatron-core', 'megatron.core'),), ('megatron.core',), ('megatron-core',)),),
    'megatron.mtp.mtp_detach_inputs': (('megatron.mtp_detach_inputs', True, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.multi_token_prediction',), ('megatron-core',)),),
    'megatron.mtp.mtp_postprocess': (('megatron.mtp_postprocess', True, (('megatron-core', 'megatron.core'),), ('megatron.core.models.gpt.gpt_model',), ('megatron-core',)),),
    'megatron.mtp.mtp_recompute': (('megatron.mtp_recompute', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.multi_token_prediction', 'megatron.core'), ('megatron-core',)),),
    'megatron.mtp.mtp_router_slots': (('megatron.mtp_router_slots', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.multi_token_prediction', 'megatron.core.transformer.moe.moe_utils', 'megatron.core', 'megatron.core.transformer.moe.router'), ('megatron-core',)),),
    'megatron.parallel.tp_group_if_none_helper': (('megatron.tp_group_if_none_helper', False, (('megatron-core', 'megatron.core'),), ('megatron.core',), ('megatron-core',)),),
    'megatron.rope.mla_thd_cp_rope': (('megatron.mla_thd_cp_rope', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.multi_latent_attention',), ('megatron-core',)),),
    'megatron.router_replay.moe_alltoall_replay_token_count': (('megatron.moe_alltoall_replay_token_count', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.moe.token_dispatcher', 'megatron.core.transformer.moe.router'), ('megatron-core',)),),
    'megatron.router_replay.router_replay': (('megatron.router_replay', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.moe.router', 'megatron.core'), ('megatron-core',)),),
    'megatron.router_replay.router_replay_validation': (('megatron.router_replay_validation', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.moe.router',), ('megatron-core',)),),
    'megatron.router_replay.routing_replay_keyword': (('megatron.routing_replay_keyword', False, (('megatron-core', 'megatron.core'),), ('megatron.core.transformer.transformer_config',), ('megatron-core',)),),
    'modelopt.max_calibrator_nan_safe': (('modelopt.max_calibrator_nan_safe', True, (('nvidia-modelopt', 'modelopt'),), ('modelopt.torch.quantization.calib.max',), ('nvidia-modelopt',)),),
    'modelopt.qat.nvfp4_cpu_fake_quant': (('modelopt.nvfp4_cpu_fake_quant', True, (('nvidia-modelopt', 'modelopt'),), ('modelopt.torch.quantization',), ('nvidia-modelopt',)),),
    'vllm.lora.lora_from_tensors': (('vllm.lora_from_tensors', False, (('vllm', 'vllm'),), ('vllm.lora.worker_manager',), ('vllm',)),),
    'vllm.moe_expert_weight_loaders': (('vllm.moe_expert_weight_loaders', False, (('vllm', 'vllm'),), ('vllm',), ('vllm',)),),
    'vllm.nvfp4_marlin_w4a16': (('vllm.nvfp4_marlin_w4a16', True, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.modelopt',), ('vllm',)),),
    'vllm.refit.compressed_tensors_nvfp4_moe_refit': (('vllm.compressed_tensors_nvfp4_moe_refit', False, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4',), ('vllm',)),),
    'vllm.refit.compressed_tensors_nvfp4_refit': (('vllm.compressed_tensors_nvfp4_refit', False, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors',), ('vllm',)),),
    'vllm.refit.fp8_refit': (('vllm.fp8_refit', False, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.fp8',), ('vllm',)),),
    'vllm.refit.mxfp4_moe_refit': (('vllm.mxfp4_moe_refit', False, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.mxfp4',), ('vllm',)),),
    'vllm.refit.mxfp8_refit': (('vllm.mxfp8_refit', False, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.modelopt',), ('vllm',)),),
    'vllm.refit.nvfp4_refit': (('vllm.nvfp4_refit', False, (('vllm', 'vllm'),), ('vllm.model_executor.layers.quantization.modelopt',), ('vllm',)),),
    'vllm.serve_signals_main_thread': (('vllm.serve_signals_main_thread', False, (('vllm', 'vllm'),), ('vllm.entrypoints.cli.serve',), ('vllm',)),),
    'vllm.shm_broadcast_bind_retry': (('vllm.shm_broadcast_bind_retry', False, (('vllm', 'vllm'),), ('vllm.distributed.device_communicators.shm_broadcast', 'vllm'), ('vllm',)),),
}
