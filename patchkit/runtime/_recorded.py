# ruff: noqa: E501
"""Generated from compat_matrix.yaml by `patchkit matrix index` (also run by `record` and `static`).

Do not edit: `patchkit matrix check` fails when this is out of step with the matrix. Read by
patchkit.runtime.drift: RECORDS[patch id][variant name] is a tuple of records, each
(versions as sorted (distribution, version) pairs, status, sorted (target, fingerprint or None) pairs).
"""

FORMAT = 2

RECORDS = {
    'bridge.expert_local_to_global': {
        'megatron-bridge>=0.2.0rc0,<0.4.0rc0': (
            ((('megatron-bridge', '0.2.0rc6'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:_megatron_local_name_to_global', 'b288d6c2bbd3ccca'),
            )),
            ((('megatron-bridge', '0.3.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:_megatron_local_name_to_global', '54d0e29b58f725e3'),
            )),
        ),
        'megatron-bridge>=0.4.0rc0,<0.4.2rc0': (
            ((('megatron-bridge', '0.4.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:_megatron_local_name_to_global', '54d0e29b58f725e3'),
            )),
        ),
        'megatron-bridge>=0.4.2rc0,<0.5.0rc0': (
            ((('megatron-bridge', '0.4.2'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:_megatron_local_name_to_global', '9b1ff3af0f0163f6'),
            )),
        ),
        'megatron-bridge>=0.5.0rc0,<0.7.0rc0': (
            ((('megatron-bridge', '0.5.1'),), 'native', (
            )),
            ((('megatron-bridge', '0.6.2'),), 'native', (
            )),
        ),
    },
    'bridge.expert_sort_key': {
        'megatron-bridge>=0.2.0rc0,<0.4.0rc0': (
            ((('megatron-bridge', '0.2.0rc6'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:extract_sort_key', '7b8e91835b9a79ba'),
            )),
            ((('megatron-bridge', '0.3.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:extract_sort_key', '7b8e91835b9a79ba'),
            )),
        ),
        'megatron-bridge>=0.4.0rc0,<0.5.0rc0': (
            ((('megatron-bridge', '0.4.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:extract_sort_key', '7b8e91835b9a79ba'),
            )),
            ((('megatron-bridge', '0.4.2'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:extract_sort_key', '7b8e91835b9a79ba'),
            )),
        ),
        'megatron-bridge>=0.5.0rc0,<0.7.0rc0': (
            ((('megatron-bridge', '0.5.1'),), 'native', (
            )),
            ((('megatron-bridge', '0.6.2'),), 'native', (
            )),
        ),
    },
    'bridge.modelopt_layer_spec': {
        'megatron-bridge>=0.2.0rc0,<0.3.0rc0': (
            ((('megatron-bridge', '0.2.0rc6'),), 'native', (
            )),
        ),
        'megatron-bridge>=0.3.0rc0,<0.4.0rc0': (
            ((('megatron-bridge', '0.3.1'),), 'verified', (
                ('megatron.bridge.models.gpt_provider:GPTModelProvider.provide', '4fde556845e319cb'),
            )),
        ),
        'megatron-bridge>=0.4.0rc0,<0.5.0rc0': (
            ((('megatron-bridge', '0.4.1'),), 'verified', (
                ('megatron.bridge.models.gpt_provider:GPTModelProvider.provide', '4fde556845e319cb'),
            )),
            ((('megatron-bridge', '0.4.2'),), 'verified', (
                ('megatron.bridge.models.gpt_provider:GPTModelProvider.provide', '4fde556845e319cb'),
            )),
        ),
        'megatron-bridge>=0.5.0rc0,<0.6.0rc0': (
            ((('megatron-bridge', '0.5.1'),), 'verified', (
                ('megatron.bridge.models.gpt_provider:GPTModelProvider.provide', 'ea424b9bcfaff252'),
            )),
        ),
        'megatron-bridge>=0.6.0rc0,<0.7.0rc0': (
            ((('megatron-bridge', '0.6.2'),), 'verified', (
                ('megatron.bridge.models.gpt_provider:GPTModelProvider.provide', 'f0884ccb895871cd'),
            )),
        ),
    },
    'bridge.quant_linear_parallelism': {
        'megatron-bridge>=0.2.0rc0,<0.4.0rc0': (
            ((('megatron-bridge', '0.2.0rc6'),), 'verified', (
                ('megatron.bridge.models.conversion.param_mapping:AutoMapping._detect_parallelism_type', '0f89611d8da551bc'),
            )),
            ((('megatron-bridge', '0.3.1'),), 'verified', (
                ('megatron.bridge.models.conversion.param_mapping:AutoMapping._detect_parallelism_type', '0f89611d8da551bc'),
            )),
        ),
        'megatron-bridge>=0.4.0rc0,<0.7.0rc0': (
            ((('megatron-bridge', '0.4.2'),), 'native', (
            )),
            ((('megatron-bridge', '0.5.1'),), 'native', (
            )),
            ((('megatron-bridge', '0.6.2'),), 'native', (
            )),
        ),
    },
    'bridge.save_hf_adapter': {
        'megatron-bridge>=0.4.0rc0,<0.7.0rc0': (
            ((('megatron-bridge', '0.4.2'),), 'native', (
            )),
            ((('megatron-bridge', '0.5.1'),), 'native', (
            )),
            ((('megatron-bridge', '0.6.2'),), 'native', (
            )),
        ),
        'v042-backport': (
            ((('megatron-bridge', '0.3.1'),), 'verified', (
            )),
        ),
    },
    'bridge.signal_handler_main_thread': {
        'main-thread-only': (
            ((('megatron-bridge', '0.2.0rc6'),), 'verified', (
                ('megatron.bridge.training.utils.sig_utils:DistributedSignalHandler.__enter__', 'e496f94652d84767'),
                ('megatron.bridge.training.utils.sig_utils:DistributedSignalHandler.release', '11e8cb4f3a67e49e'),
            )),
            ((('megatron-bridge', '0.3.1'),), 'verified', (
                ('megatron.bridge.training.utils.sig_utils:DistributedSignalHandler.__enter__', 'e496f94652d84767'),
                ('megatron.bridge.training.utils.sig_utils:DistributedSignalHandler.release', '11e8cb4f3a67e49e'),
            )),
            ((('megatron-bridge', '0.5.1'),), 'verified', (
                ('megatron.bridge.training.utils.sig_utils:DistributedSignalHandler.__enter__', 'e496f94652d84767'),
                ('megatron.bridge.training.utils.sig_utils:DistributedSignalHandler.release', '11e8cb4f3a67e49e'),
            )),
        ),
        'megatron-bridge>=0.6.0,<0.7.0rc0': (
            ((('megatron-bridge', '0.6.2'),), 'native', (
            )),
        ),
    },
    'bridge.skip_quantizer_params': {
        'megatron-bridge>=0.2.0rc0,<0.4.0rc0': (
            ((('megatron-bridge', '0.2.0rc6'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:persistent_buffers', 'd0ee27e83204d122'),
            )),
            ((('megatron-bridge', '0.3.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:persistent_buffers', 'd0ee27e83204d122'),
            )),
        ),
        'megatron-bridge>=0.4.0rc0,<0.7.0rc0': (
            ((('megatron-bridge', '0.4.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:persistent_buffers', 'd0ee27e83204d122'),
            )),
            ((('megatron-bridge', '0.4.2'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:persistent_buffers', 'd0ee27e83204d122'),
            )),
            ((('megatron-bridge', '0.5.1'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:persistent_buffers', 'd0ee27e83204d122'),
            )),
            ((('megatron-bridge', '0.6.2'),), 'verified', (
                ('megatron.bridge.models.conversion.model_bridge:persistent_buffers', 'd0ee27e83204d122'),
            )),
        ),
    },
    'megatron.dist_ckpt_async_queue_reset': {
        'close-abort': (
            ((('megatron-core', '0.15.3'),), 'verified', (
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
            )),
        ),
        'close-without-abort': (
            ((('megatron-core', '0.14.0'),), 'verified', (
            )),
        ),
    },
    'megatron.dist_ckpt_blocking_d2h': {
        'megatron-core>=0.14,<0.20': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync.get_save_function_and_args', '3697375ed91f4daa'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync.get_save_function_and_args', '3697375ed91f4daa'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync.get_save_function_and_args', '3697375ed91f4daa'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync.get_save_function_and_args', 'a47221eabc37bda6'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync.get_save_function_and_args', 'a47221eabc37bda6'),
            )),
        ),
    },
    'megatron.dist_ckpt_partial_load': {
        'megatron-core>=0.14,<0.20': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.torch:MCoreLoadPlanner.create_local_plan', 'd3239d69d1fb2525'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.torch:MCoreLoadPlanner.create_local_plan', 'd3239d69d1fb2525'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.torch:MCoreLoadPlanner.create_local_plan', 'd3239d69d1fb2525'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.torch:MCoreLoadPlanner.create_local_plan', 'd3239d69d1fb2525'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.torch:MCoreLoadPlanner.create_local_plan', 'd3239d69d1fb2525'),
            )),
        ),
    },
    'megatron.dist_ckpt_safe_load': {
        'common-strategy-safe-globals': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy.load_common', 'f9b6541a11415f2e'),
                ('megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy.load_sharded_objects', 'ac63262fcd9a16c4'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy.load_common', 'f9b6541a11415f2e'),
                ('megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy.load_sharded_objects', 'ac63262fcd9a16c4'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy.load_common', 'f9b6541a11415f2e'),
                ('megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy.load_sharded_objects', 'ac63262fcd9a16c4'),
            )),
        ),
        'native-dcp-common-state': (
            ((('megatron-core', '0.19.2'),), 'native', (
            )),
        ),
    },
    'megatron.mla_thd_cp_rope': {
        'full-table-for-cp-group': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb', 'de2b7abbef1b4127'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb', 'de2b7abbef1b4127'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb', '57d1a95ae16d7553'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb', '4027886d34df28fb'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb', '4027886d34df28fb'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb', '4f2ab53f7c2e00f0'),
            )),
        ),
    },
    'megatron.moe_alltoall_replay_token_count': {
        'megatron-core>=0.14,<0.20': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.forward', '6e9b980e69e11ffe'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.preprocess', '81eae65c2eb06ab9'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.forward', '6e9b980e69e11ffe'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.preprocess', '81eae65c2eb06ab9'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.forward', '476cef377ee2ad31'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.preprocess', '6778e51297edae81'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.forward', '4fe8711dd1b9f40c'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.preprocess', '6778e51297edae81'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.forward', '4fe8711dd1b9f40c'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.preprocess', '6778e51297edae81'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.forward', '4fe8711dd1b9f40c'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.preprocess', '6778e51297edae81'),
            )),
        ),
    },
    'megatron.moe_expert_load_metrics': {
        'log-after-aux-loss': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter._apply_aux_loss', 'd1d16422a6cd6b78'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter._apply_aux_loss', 'd1d16422a6cd6b78'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter._apply_aux_loss', '942356335296b2d2'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter._apply_aux_loss', '942356335296b2d2'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter._apply_aux_loss', '942356335296b2d2'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter._apply_aux_loss', '942356335296b2d2'),
            )),
        ),
    },
    'megatron.moe_recompute_release': {
        'release-after-combine': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher.combine_postprocess', '3ab0a9e5008eca55'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.combine_postprocess', '8c98188f8a423343'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher.combine_postprocess', '3ab0a9e5008eca55'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.combine_postprocess', '8c98188f8a423343'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher.combine_postprocess', '3ab0a9e5008eca55'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.combine_postprocess', '8c98188f8a423343'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher.combine_postprocess', '3ab0a9e5008eca55'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.combine_postprocess', '8c98188f8a423343'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher.combine_postprocess', '3ab0a9e5008eca55'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.combine_postprocess', '64b67128c93af290'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher.combine_postprocess', '3ab0a9e5008eca55'),
                ('megatron.core.transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher.combine_postprocess', '64b67128c93af290'),
            )),
        ),
    },
    'megatron.mtp_detach_inputs': {
        'detach-in-get-embeddings': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._get_embeddings', 'd043121893c73656'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._get_embeddings', 'd043121893c73656'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._get_embeddings', 'af08fd147e94e37a'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._get_embeddings', 'af08fd147e94e37a'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._get_embeddings', '8fe6b056ae0a2919'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._get_embeddings', '82cecc4109993c8f'),
            )),
        ),
    },
    'megatron.mtp_postprocess': {
        'inline-mtp-loss': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel._postprocess', '376edb5455f02cdd'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel._postprocess', '8f6025863545ec9b'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel._postprocess', 'bc9d7fba37cd4afa'),
            )),
        ),
        'process-mtp-loss': (
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel._postprocess', '9dcc1abe37a96976'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel._postprocess', '3c9b703f02d84ae9'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel._postprocess', 'bab56ade7201601a'),
            )),
        ),
    },
    'megatron.mtp_recompute': {
        'accept-padding-mask': (
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._checkpointed_forward', 'd4e6e52b6d1c45c9'),
            )),
        ),
        'closure-non-tensor-args': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._checkpointed_forward', '0217efb408437d35'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._checkpointed_forward', '0217efb408437d35'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._checkpointed_forward', '0217efb408437d35'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer._checkpointed_forward', '0217efb408437d35'),
            )),
        ),
        'native-0.19': (
            ((('megatron-core', '0.19.2'),), 'native', (
            )),
        ),
    },
    'megatron.mtp_router_slots': {
        'native-0.17': (
            ((('megatron-core', '0.17.1'),), 'native', (
            )),
            ((('megatron-core', '0.18.2'),), 'native', (
            )),
        ),
        'number-after-decoder': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.moe.moe_utils:track_moe_metrics', 'd0ec87af5e26c06d'),
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer.__init__', '3dc10bf0fc30c3f4'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.moe.moe_utils:track_moe_metrics', 'd0ec87af5e26c06d'),
                ('megatron.core.transformer.multi_token_prediction:MultiTokenPredictionLayer.__init__', '45dced6d1b7247a3'),
            )),
        ),
        'replay-layer-number': (
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:Router.set_layer_number', 'd96a8ce136803ae5'),
            )),
        ),
        'size-forced-tracker': (
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.moe.moe_utils:track_moe_metrics', '52f51d6fa8289be8'),
            )),
        ),
    },
    'megatron.output_processor': {
        'forward-keywords': (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel.forward', '3ee3c6253b571664'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel.forward', '6a6804898829f9cd'),
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel.forward', 'b8695e940042677c'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.models.gpt.gpt_model:GPTModel.forward', '975e7893b41792aa'),
            )),
        ),
        'native-0.18': (
            ((('megatron-core', '0.18.2'),), 'native', (
            )),
            ((('megatron-core', '0.19.2'),), 'native', (
            )),
        ),
    },
    'megatron.router_replay': {
        "megatron-core>=0.14,<0.16: backport of 0.16's replay onto TopKRouter": (
            ((('megatron-core', '0.14.0'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.__init__', '2397b6fc053560d0'),
                ('megatron.core.transformer.moe.router:TopKRouter.routing', '6a6917ce267827b0'),
                ('megatron.core.transformer.moe.router:topk_routing_with_score_function', 'd7c267a7d5bc7473'),
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
                ('megatron.core.transformer.moe.router:TopKRouter.__init__', 'fd938166311d8a43'),
                ('megatron.core.transformer.moe.router:TopKRouter.routing', '42b25d11403086e5'),
                ('megatron.core.transformer.moe.router:topk_routing_with_score_function', 'fee0a325bfb6d4e8'),
            )),
        ),
        'megatron-core>=0.16,<0.20': (
            ((('megatron-core', '0.16.1'),), 'native', (
            )),
            ((('megatron-core', '0.17.1'),), 'native', (
            )),
            ((('megatron-core', '0.18.2'),), 'native', (
            )),
            ((('megatron-core', '0.19.2'),), 'native', (
            )),
        ),
    },
    'megatron.router_replay_validation': {
        'megatron-core>=0.14,<0.20': (
            ((('megatron-core', '0.14.0'),), 'verified', (
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
            )),
            ((('megatron-core', '0.16.1'),), 'verified', (
                ('megatron.core.transformer.moe.router:RouterReplay.get_replay_topk', '0be86028ce702456'),
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
                ('megatron.core.transformer.moe.router:RouterReplay.get_replay_topk', '0be86028ce702456'),
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:RouterReplay.get_replay_topk', '0be86028ce702456'),
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
                ('megatron.core.transformer.moe.router:RouterReplay.get_replay_topk', '0be86028ce702456'),
            )),
        ),
    },
    'megatron.routing_replay_keyword': {
        'attribute-after-init': (
            ((('megatron-core', '0.14.0'),), 'verified', (
            )),
            ((('megatron-core', '0.15.3'),), 'verified', (
            )),
        ),
        'field-keyword': (
            ((('megatron-core', '0.16.1'),), 'verified', (
            )),
            ((('megatron-core', '0.17.1'),), 'verified', (
            )),
            ((('megatron-core', '0.18.2'),), 'verified', (
            )),
            ((('megatron-core', '0.19.2'),), 'verified', (
            )),
        ),
    },
    'megatron.swiglu_singleton_local_shards': {
        'megatron-core>=0.14.0rc0': (
            ((('megatron-core', '0.14.0'),), 'native', (
            )),
            ((('megatron-core', '0.15.3'),), 'native', (
            )),
            ((('megatron-core', '0.16.1'),), 'native', (
            )),
            ((('megatron-core', '0.17.1'),), 'native', (
            )),
            ((('megatron-core', '0.18.2'),), 'native', (
            )),
            ((('megatron-core', '0.19.2'),), 'native', (
            )),
        ),
    },
    'megatron.tms_hook_mode': {
        'keep-process-hook-mode': (
            ((('megatron-core', '0.16.1'), ('torch-memory-saver', '0.0.10')), 'verified', (
                ('torch_memory_saver.entrypoint:TorchMemorySaver.hook_mode', '92ef3266c15dc93a'),
            )),
            ((('megatron-core', '0.17.1'), ('torch-memory-saver', '0.0.10')), 'verified', (
                ('torch_memory_saver.entrypoint:TorchMemorySaver.hook_mode', '92ef3266c15dc93a'),
            )),
            ((('megatron-core', '0.18.2'), ('torch-memory-saver', '0.0.10')), 'verified', (
                ('torch_memory_saver.entrypoint:TorchMemorySaver.hook_mode', '92ef3266c15dc93a'),
            )),
            ((('megatron-core', '0.19.2'), ('torch-memory-saver', '0.0.10')), 'verified', (
                ('torch_memory_saver.entrypoint:TorchMemorySaver.hook_mode', '92ef3266c15dc93a'),
            )),
        ),
        'native-before-0.16': (
            ((('megatron-core', '0.14.0'), ('torch-memory-saver', '0.0.10')), 'native', (
            )),
            ((('megatron-core', '0.15.3'), ('torch-memory-saver', '0.0.10')), 'native', (
            )),
        ),
    },
    'megatron.tp_group_if_none_helper': {
        'native-0.13': (
            ((('megatron-core', '0.14.0'),), 'native', (
            )),
            ((('megatron-core', '0.15.3'),), 'native', (
            )),
            ((('megatron-core', '0.16.1'),), 'native', (
            )),
            ((('megatron-core', '0.17.1'),), 'native', (
            )),
            ((('megatron-core', '0.18.2'),), 'native', (
            )),
            ((('megatron-core', '0.19.2'),), 'native', (
            )),
        ),
    },
    'modelopt.max_calibrator_nan_safe': {
        'zero-fill-nonfinite': (
            ((('nvidia-modelopt', '0.43.0'),), 'verified', (
                ('modelopt.torch.quantization.calib.max:MaxCalibrator.collect', '8f03871c63359362'),
            )),
            ((('nvidia-modelopt', '0.44.0'),), 'verified', (
                ('modelopt.torch.quantization.calib.max:MaxCalibrator.collect', '8f03871c63359362'),
            )),
            ((('nvidia-modelopt', '0.47.0'),), 'verified', (
                ('modelopt.torch.quantization.calib.max:MaxCalibrator.collect', '8f03871c63359362'),
            )),
            ((('nvidia-modelopt', '0.48.0rc1'),), 'verified', (
                ('modelopt.torch.quantization.calib.max:MaxCalibrator.collect', '8f03871c63359362'),
            )),
        ),
    },
    'modelopt.nvfp4_cpu_fake_quant': {
        'nvidia-modelopt>=0.43,<0.48': (
            ((('nvidia-modelopt', '0.43.0'),), 'verified', (
            )),
            ((('nvidia-modelopt', '0.44.0'),), 'verified', (
            )),
            ((('nvidia-modelopt', '0.47.0'),), 'verified', (
            )),
        ),
        'nvidia-modelopt>=0.48.0rc0,<0.49': (
            ((('nvidia-modelopt', '0.48.0rc1'),), 'verified', (
            )),
        ),
    },
    'vllm.compressed_tensors_nvfp4_moe_refit': {
        'ct-nvfp4-moe': (
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.create_weights', '0cedd575e393f9ec'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading', '2bd69cd992b16bd1'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.create_weights', '0cedd575e393f9ec'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading', '2bd69cd992b16bd1'),
            )),
        ),
        'ct-nvfp4-moe-keep-a16': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.__init__', '1f3a86e01c71eaca'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.create_weights', '0cedd575e393f9ec'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4:CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading', '7edb2e16ed8eb1bc'),
            )),
        ),
    },
    'vllm.compressed_tensors_nvfp4_refit': {
        'ct-nvfp4-linear': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:CompressedTensorsLinearMethod.create_weights', '76e9f6c949ca1cfd'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:CompressedTensorsLinearMethod.process_weights_after_loading', 'b8c132c2a853bc55'),
            )),
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:CompressedTensorsLinearMethod.create_weights', '76e9f6c949ca1cfd'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:CompressedTensorsLinearMethod.process_weights_after_loading', 'b8c132c2a853bc55'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:CompressedTensorsLinearMethod.create_weights', '76e9f6c949ca1cfd'),
                ('vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:CompressedTensorsLinearMethod.process_weights_after_loading', 'b8c132c2a853bc55'),
            )),
        ),
    },
    'vllm.fp8_refit': {
        'fp8-linear-moe': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.create_weights', 'b64a1467ec7f6004'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.process_weights_after_loading', '9b376cec287050b2'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.create_weights', 'f8717e2fb4576b25'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.process_weights_after_loading', 'bc002f85ab778379'),
            )),
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.create_weights', '43c72edff2548985'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.process_weights_after_loading', '508ab112271ebe76'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.create_weights', 'd842c9f709284689'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.process_weights_after_loading', 'b5381668bce296bc'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.create_weights', '43c72edff2548985'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.process_weights_after_loading', 'f7b4887ef7407d47'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.create_weights', '6e2c90bc707bd138'),
                ('vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.process_weights_after_loading', 'ccffdbea8c450dbd'),
            )),
        ),
    },
    'vllm.lora_from_tensors': {
        'classification-head-validation': (
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', 'de7599e6945a45fe'),
            )),
        ),
        'classification-validations': (
            ((('vllm', '0.31.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', '817ad0ff2e92b6a2'),
            )),
        ),
        'hf-mapper': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', 'a460cd98855d40a2'),
            )),
        ),
        'moe-format-validation': (
            ((('vllm', '0.32.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', 'ccedaebd3f966f38'),
            )),
        ),
        'rename-mapper': (
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', 'a7744235384ed1b8'),
            )),
            ((('vllm', '0.30.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', 'a7744235384ed1b8'),
            )),
        ),
        'unstacked-mapper': (
            ((('vllm', '0.25.1'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', '78108bac0ee66779'),
            )),
            ((('vllm', '0.26.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', '78108bac0ee66779'),
            )),
            ((('vllm', '0.27.1'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', '78108bac0ee66779'),
            )),
            ((('vllm', '0.28.0'),), 'verified', (
                ('vllm.lora.worker_manager:WorkerLoRAManager._load_adapter', '78108bac0ee66779'),
            )),
        ),
    },
    'vllm.moe_expert_weight_loaders': {
        'vllm>=0.24,<0.34': (
            ((('vllm', '0.24.0'),), 'native', (
            )),
            ((('vllm', '0.29.0'),), 'native', (
            )),
            ((('vllm', '0.33.0'),), 'native', (
            )),
        ),
    },
    'vllm.mxfp4_moe_refit': {
        'mxfp4-moe-marlin': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.mxfp4:GptOssMxfp4MoEMethod.create_weights', 'd588281de819852b'),
                ('vllm.model_executor.layers.quantization.mxfp4:GptOssMxfp4MoEMethod.process_weights_after_loading', '15ba6c6e3f36fa3c'),
                ('vllm.model_executor.layers.quantization.mxfp4:Mxfp4MoEMethod.create_weights', 'd588281de819852b'),
                ('vllm.model_executor.layers.quantization.mxfp4:Mxfp4MoEMethod.process_weights_after_loading', 'bb74c3a8c73b1dfd'),
            )),
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.mxfp4:GptOssMxfp4MoEMethod.create_weights', '6d371365dfcd8dea'),
                ('vllm.model_executor.layers.quantization.mxfp4:GptOssMxfp4MoEMethod.process_weights_after_loading', '15ba6c6e3f36fa3c'),
                ('vllm.model_executor.layers.quantization.mxfp4:Mxfp4MoEMethod.create_weights', 'e8497c61f6913577'),
                ('vllm.model_executor.layers.quantization.mxfp4:Mxfp4MoEMethod.process_weights_after_loading', 'bb74c3a8c73b1dfd'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.mxfp4:GptOssMxfp4MoEMethod.create_weights', '6d371365dfcd8dea'),
                ('vllm.model_executor.layers.quantization.mxfp4:GptOssMxfp4MoEMethod.process_weights_after_loading', '15ba6c6e3f36fa3c'),
                ('vllm.model_executor.layers.quantization.mxfp4:Mxfp4MoEMethod.create_weights', 'e8497c61f6913577'),
                ('vllm.model_executor.layers.quantization.mxfp4:Mxfp4MoEMethod.process_weights_after_loading', '61647e60f816fe2d'),
            )),
        ),
    },
    'vllm.mxfp8_refit': {
        'modelopt-mxfp8-linear-moe': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.create_weights', 'd3fff99acfec6840'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.process_weights_after_loading', 'f1e1e87300a1bc2e'),
            )),
            ((('vllm', '0.25.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', 'ea2ca6fcc54a4ad3'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.create_weights', 'd3fff99acfec6840'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.process_weights_after_loading', 'f1e1e87300a1bc2e'),
            )),
            ((('vllm', '0.26.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', 'ea2ca6fcc54a4ad3'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.create_weights', 'd3fff99acfec6840'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.process_weights_after_loading', 'f1e1e87300a1bc2e'),
            )),
            ((('vllm', '0.27.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', 'ea2ca6fcc54a4ad3'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.create_weights', 'd3fff99acfec6840'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.process_weights_after_loading', 'f1e1e87300a1bc2e'),
            )),
            ((('vllm', '0.28.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.create_weights', 'd3fff99acfec6840'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.process_weights_after_loading', 'f1e1e87300a1bc2e'),
            )),
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.create_weights', 'd3fff99acfec6840'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8LinearMethod.process_weights_after_loading', 'f1e1e87300a1bc2e'),
            )),
        ),
        'modelopt-mxfp8-moe': (
            ((('vllm', '0.30.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
            )),
            ((('vllm', '0.31.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
            )),
            ((('vllm', '0.32.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.create_weights', '87090f691b0f1212'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptMxFp8FusedMoE.process_weights_after_loading', '240c5735580cfaf8'),
            )),
        ),
    },
    'vllm.nvfp4_marlin_w4a16': {
        'quant-method-w4a16': (
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4Config.__init__', '2634aa29b97e6e8b'),
            )),
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4Config.__init__', '2634aa29b97e6e8b'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4Config.__init__', '6f9f9b7bcf4bbe5e'),
            )),
        ),
    },
    'vllm.nvfp4_refit': {
        'modelopt-linear-method': (
            ((('vllm', '0.30.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.create_weights', '381f86b25f27f677'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.process_weights_after_loading', '509eca2ac4baaa26'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', 'a5791af99c08073c'),
            )),
            ((('vllm', '0.31.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.create_weights', 'e796b3e8a6f3335d'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.process_weights_after_loading', 'a37e2be700fb8d64'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', 'a5791af99c08073c'),
            )),
            ((('vllm', '0.32.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.create_weights', 'e796b3e8a6f3335d'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.process_weights_after_loading', 'a37e2be700fb8d64'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', 'f475f1c66677e90a'),
            )),
            ((('vllm', '0.33.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.create_weights', 'e796b3e8a6f3335d'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod.process_weights_after_loading', '66192bb9e7ed283e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '4029ac5649864beb'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', 'f475f1c66677e90a'),
            )),
        ),
        'modelopt-nvfp4-linear': (
            ((('vllm', '0.12.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '14a0feea4c20875e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '3ce4ce7150ab6667'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '93d48b453108c3e2'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', '87a982df49f5f689'),
            )),
            ((('vllm', '0.13.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '14a0feea4c20875e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '4d141dd94f517f75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '93d48b453108c3e2'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', '87a982df49f5f689'),
            )),
            ((('vllm', '0.14.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '3a085a4c5c5e913e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '0af0d0b996601d84'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '93d48b453108c3e2'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', '87a982df49f5f689'),
            )),
            ((('vllm', '0.15.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '2fa975444fef6359'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '93d48b453108c3e2'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', '87a982df49f5f689'),
            )),
            ((('vllm', '0.16.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '0c85d770204e0aa8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'bedf7da21cc56622'),
            )),
            ((('vllm', '0.17.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '1cdedefd49aab47e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'bedf7da21cc56622'),
            )),
            ((('vllm', '0.18.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '5b42c51d5adbdde8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'bedf7da21cc56622'),
            )),
            ((('vllm', '0.19.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '5b42c51d5adbdde8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'bedf7da21cc56622'),
            )),
            ((('vllm', '0.20.2'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '5b42c51d5adbdde8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
            )),
        ),
        'modelopt-nvfp4-linear-w4a16': (
            ((('vllm', '0.21.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', '96f3143d62fa2922'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '5b42c51d5adbdde8'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', 'b91749e2a598532c'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', '0f89b7b1c40c203f'),
            )),
            ((('vllm', '0.22.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '82dad7b4eb224cb5'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', 'b91749e2a598532c'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', '0f89b7b1c40c203f'),
            )),
            ((('vllm', '0.23.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '82dad7b4eb224cb5'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '80275d0f88a64c75'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', 'b91749e2a598532c'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', '0f89b7b1c40c203f'),
            )),
            ((('vllm', '0.24.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '82dad7b4eb224cb5'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '524a5189e72b19a6'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', 'b91749e2a598532c'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', '0f89b7b1c40c203f'),
            )),
            ((('vllm', '0.25.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '4e39afd25632e02e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '524a5189e72b19a6'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', 'b91749e2a598532c'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', '0f89b7b1c40c203f'),
            )),
            ((('vllm', '0.26.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '4e39afd25632e02e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '524a5189e72b19a6'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', 'b91749e2a598532c'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', '0f89b7b1c40c203f'),
            )),
            ((('vllm', '0.27.1'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '4e39afd25632e02e'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '524a5189e72b19a6'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', '768c0458c67d0e87'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', 'eb6f6f1d30854f32'),
            )),
            ((('vllm', '0.28.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', 'c71d0c55ab9fb8ea'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '524a5189e72b19a6'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', '768c0458c67d0e87'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', 'eb6f6f1d30854f32'),
            )),
            ((('vllm', '0.29.0'),), 'verified', (
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.create_weights', 'bee4595d0936c837'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE.process_weights_after_loading', '87a0ccec5f1fac21'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.create_weights', '524a5189e72b19a6'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod.process_weights_after_loading', 'fabfc933ff4b9655'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.create_weights', '768c0458c67d0e87'),
                ('vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading', 'eb6f6f1d30854f32'),
            )),
        ),
    },
    'vllm.serve_signals_main_thread': {
        'serve-module-signals': (
            ((('vllm', '0.24.0'),), 'verified', (
            )),
            ((('vllm', '0.29.0'),), 'verified', (
            )),
            ((('vllm', '0.33.0'),), 'verified', (
            )),
        ),
    },
}
