"""``vllm.qwen3_5_text_config_defaults`` (native, vLLM 0.24-0.33): the Qwen3.5 text configs vLLM loads end
with their declared ``tie_word_embeddings=False`` and pad/bos/eos token ids, or the checkpoint's values,
as transformers' own Qwen3.5 config classes do; ROLL's replacement constructors are not needed.

On 0.24-0.31 the class under test is vLLM's own (``vllm.transformers_utils.configs.qwen3_5``), on
0.32-0.33 transformers': whichever ``get_config`` picks."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from patchkit.patches.vllm._checks._qwen3_5_configs import (
    DECLARED_DEFAULTS,
    FAMILIES,
    GIVEN_VALUES,
    MROPE_PARAMETERS,
    Family,
    config_json,
    load_with_vllm,
    special_attributes,
    text_config_class,
)

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason

pytestmark = pytest.mark.usefixtures("patches_restored")

PATCH = "vllm.qwen3_5_text_config_defaults"

#: transformers' own class for each text ``model_type``: the reference for what a Qwen3.5 config ends with.
TRANSFORMERS_CLASSES = {
    "qwen3_5_text": ("transformers.models.qwen3_5.configuration_qwen3_5", "Qwen3_5TextConfig"),
    "qwen3_5_moe_text": ("transformers.models.qwen3_5_moe.configuration_qwen3_5_moe", "Qwen3_5MoeTextConfig"),
}


def transformers_text_config(family: Family, config: dict[str, Any]) -> Any:
    """``config``'s text part built by transformers' own Qwen3.5 class (not by vLLM's registry)."""
    module, name = TRANSFORMERS_CLASSES[family.text_model_type]
    text = {key: value for key, value in config["text_config"].items() if key != "model_type"}
    return getattr(importlib.import_module(module), name)(**text)


FAMILY_IDS = [family.model_type for family in FAMILIES]


def test_declared_native_on_this_release():
    with patchkit.applied(PATCH) as (record,):
        assert record.reason is Reason.NATIVE, record.to_dict()


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_loaded_text_config_ends_with_the_declared_defaults(family):
    config = config_json(family)
    loaded = special_attributes(load_with_vllm(config).text_config)
    assert loaded == DECLARED_DEFAULTS
    assert loaded == special_attributes(transformers_text_config(family, config))


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_loaded_text_config_keeps_the_values_the_checkpoint_gives(family):
    config = config_json(family, GIVEN_VALUES)
    loaded = special_attributes(load_with_vllm(config).text_config)
    assert loaded == GIVEN_VALUES
    assert loaded == special_attributes(transformers_text_config(family, config))


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_text_config_class_built_directly_keeps_defaults_and_keyword_values(family):
    """What ROLL's replacement ``__init__`` changes: the class called with no arguments and with them."""
    cls = text_config_class(family)
    assert special_attributes(cls()) == DECLARED_DEFAULTS
    assert special_attributes(cls(**GIVEN_VALUES)) == GIVEN_VALUES


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_loaded_text_config_keeps_the_mrope_keys(family):
    rope = load_with_vllm(config_json(family, GIVEN_VALUES)).text_config.rope_parameters
    assert rope["mrope_section"] == MROPE_PARAMETERS["mrope_section"]
    assert rope["mrope_interleaved"] is True
    assert rope["partial_rotary_factor"] == MROPE_PARAMETERS["partial_rotary_factor"]


def test_qwen3_5_config_check_is_verified():
    with patchkit.applied(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.qwen3_5_text_config_defaults")
def test_qwen3_5_config_check_fails_when_the_base_init_overwrites_the_attributes(monkeypatch):
    """transformers v4's order put back on the class vLLM loads: the base ``__init__``'s own values
    (``tie_word_embeddings=True``, token ids ``None``) land after the subclass's."""
    cls = text_config_class(FAMILIES[0])
    original = cls.__init__

    def base_init_last(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.tie_word_embeddings = True
        self.pad_token_id = self.bos_token_id = self.eos_token_id = None

    monkeypatch.setattr(cls, "__init__", base_init_last)
    with patchkit.applied(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "qwen3_5_text loaded by vLLM from a config.json that leaves them out: expected " \
        "{'tie_word_embeddings': False" in verdict.message, verdict.message
