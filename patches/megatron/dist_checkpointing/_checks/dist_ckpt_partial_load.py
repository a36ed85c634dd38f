"""Self-check of ``megatron.dist_ckpt_partial_load``: a checkpoint loads into a state dict with a tensor
it lacks; present tensors keep upstream's shape check."""

from __future__ import annotations

import tempfile

import torch

from patchkit.selfcheck import CheckContext, expect

from ._roundtrip import load, one_rank_gloo, outcome, save, sharded

_SAVED = torch.arange(6, dtype=torch.float32).reshape(2, 3)


def check_dist_ckpt_partial_load(context: CheckContext) -> None:
    """A checkpoint of ``weights`` loads into ``{weights, new_head}``: ``weights`` comes from the
    checkpoint, ``new_head`` keeps its values (upstream raises ``KeyError``); a ``weights`` of another
    shape still raises."""
    with one_rank_gloo(), tempfile.TemporaryDirectory(prefix="patchkit-ckpt-") as directory:
        save({"weights": sharded("weights", _SAVED.clone())}, directory)
        new_head = torch.full((4,), 7.0)
        loaded: dict[str, torch.Tensor] = {}
        partial = outcome(lambda: loaded.update(load(
            {"weights": sharded("weights", torch.zeros(2, 3)), "new_head": sharded("new_head", new_head.clone())},
            directory)))
        expect(partial == "ok", "a checkpoint loads into a state dict with a tensor it lacks", "ok", partial)
        expect(torch.equal(loaded["weights"], _SAVED), "the tensor the checkpoint holds is read",
               _SAVED.tolist(), loaded["weights"].tolist())
        expect(torch.equal(loaded["new_head"], new_head), "the tensor it lacks keeps its values",
               new_head.tolist(), loaded["new_head"].tolist())
        reshaped = outcome(lambda: load({"weights": sharded("weights", torch.zeros(3, 2))}, directory))
        expect("shape" in reshaped.lower(), "a present tensor of another global shape still raises",
               "an error about the global shape", reshaped)
