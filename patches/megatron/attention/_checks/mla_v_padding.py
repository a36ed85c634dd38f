"""Self-check of ``megatron.mla_v_padding``: MLA's packed (THD) forward hands core attention V padded to the
q/k head size and equals the unpadded computation."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import first_line, megatron_on

# Zero columns of V add exact zeros; the rows differ only by float reassociation of the einsums.
TOLERANCE = 1e-5


def check_mla_v_padding(context: CheckContext) -> None:
    """A tiny MLA (q/k head size 16, V 8) on three packed sequences (6, 4, 2 tokens), TE's core attention stood in.

    The stand-in refuses THD input whose q/k and V head sizes differ, as TransformerEngine does where
    no kernel serves them. The packed forward must reach it with V of the q/k size (the V size it
    declares set to match for the call and put back after) and give the rows of each sequence run
    alone unpacked, where core attention gets V of its own size. Upstream 0.14-0.17 hand it V of 8.
    """
    from ._mla_core_attention import (
        QK_HEAD_DIM,
        QK_POS_EMB_HEAD_DIM,
        V_HEAD_DIM,
        build_mla,
        packed_forward,
        packed_hidden_states,
        sequence_by_sequence,
    )

    qk_size = QK_HEAD_DIM + QK_POS_EMB_HEAD_DIM
    with megatron_on(context.device), torch.no_grad():
        layer = build_mla(context.device)
        hidden_states = packed_hidden_states(context.device)
        reference = sequence_by_sequence(layer, hidden_states)
        calls = layer.core_attention.calls
        try:
            packed = packed_forward(layer, hidden_states)
        except Exception as exc:  # upstream's unpadded V reaches the stand-in's kernel limit
            expect(False, "MLA's packed (THD) forward runs on core attention that needs equal head sizes",
                   "an output", first_line(exc))
            return
        thd_call = calls[-1]
        expect(thd_call.qkv_format == "thd" and thd_call.value_head_dim == qk_size,
               "V head size core attention gets for THD input", qk_size, thd_call.value_head_dim)
        expect(thd_call.declared_v_head_dim == qk_size, "V head size core attention declares during the THD call",
               qk_size, thd_call.declared_v_head_dim)
        declared = layer.core_attention.hidden_size_per_attention_head_v
        expect(declared == V_HEAD_DIM, "V head size core attention declares after the call", V_HEAD_DIM, declared)
        difference = (packed - reference).abs().max().item()
        expect(difference <= TOLERANCE, "packed output against each sequence alone, unpadded (largest difference)",
               f"<= {TOLERANCE}", difference)
        sbhd_sizes = {call.value_head_dim for call in calls if call.qkv_format == "sbhd"}
        expect(sbhd_sizes == {V_HEAD_DIM}, "V head size core attention gets for unpacked input", {V_HEAD_DIM},
               sbhd_sizes)
