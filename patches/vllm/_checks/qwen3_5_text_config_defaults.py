"""Self-check of ``vllm.qwen3_5_text_config_defaults`` (native: vLLM's Qwen3.5 configs keep their own
defaults and the checkpoint's values): for both Qwen3.5 families, the text config vLLM loads from a
``config.json`` ends with the class defaults, or with the values the file gives, for
``tie_word_embeddings`` and the pad/bos/eos token ids, and keeps the mRoPE keys of its RoPE parameters."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._qwen3_5_configs import (
    DECLARED_DEFAULTS,
    FAMILIES,
    GIVEN_VALUES,
    MROPE_PARAMETERS,
    config_json,
    load_with_vllm,
    special_attributes,
)


def check_qwen3_5_text_config_defaults(context: CheckContext) -> None:
    """Each family's text config, loaded by vLLM's ``get_config``, ends with the declared defaults and with
    the given values; the mRoPE keys survive RoPE validation. ``context`` is unused: no tensors."""
    del context
    for family in FAMILIES:
        defaults = special_attributes(load_with_vllm(config_json(family)).text_config)
        expect(defaults == DECLARED_DEFAULTS,
               f"{family.text_model_type} loaded by vLLM from a config.json that leaves them out",
               DECLARED_DEFAULTS, defaults)
        loaded = load_with_vllm(config_json(family, GIVEN_VALUES)).text_config
        given = special_attributes(loaded)
        expect(given == GIVEN_VALUES, f"{family.text_model_type} loaded by vLLM from a config.json that sets them",
               GIVEN_VALUES, given)
        mrope = {key: (loaded.rope_parameters or {}).get(key) for key in ("mrope_section", "mrope_interleaved")}
        expected_mrope = {key: MROPE_PARAMETERS[key] for key in mrope}
        expect(mrope == expected_mrope, f"{family.text_model_type}'s rope_parameters keep the mRoPE keys",
               expected_mrope, mrope)
