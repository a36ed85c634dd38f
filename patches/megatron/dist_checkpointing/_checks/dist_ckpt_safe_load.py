"""Self-check of ``megatron.dist_ckpt_safe_load``: a checkpoint whose common state holds an optimizer
class loads weights-only; one holding an arbitrary callable is still refused."""

from __future__ import annotations

import os
import tempfile

import torch

from patchkit.selfcheck import CheckContext, expect

from ._roundtrip import load, one_rank_gloo, outcome, save, sharded


def check_dist_ckpt_safe_load(context: CheckContext) -> None:
    """``dist_checkpointing.load`` of a checkpoint whose common state names ``torch.optim.AdamW`` (as
    verl's optimizer state does) returns it, with ``weights_only`` still on: a checkpoint naming
    ``os.getcwd`` is refused. Upstream 0.14-0.16 refuse both (``Unsupported global``). Where native
    (0.17+, common state inside DCP, unpickled without ``weights_only``) both load, and only the first
    is checked."""
    with one_rank_gloo(), tempfile.TemporaryDirectory(prefix="patchkit-ckpt-") as directory:
        optimizer_dir = os.path.join(directory, "optimizer")
        unsafe_dir = os.path.join(directory, "unsafe")
        os.makedirs(optimizer_dir)
        os.makedirs(unsafe_dir)
        save({"weights": sharded("weights", torch.ones(2, 2)), "optimizer_class": torch.optim.AdamW}, optimizer_dir)
        save({"weights": sharded("weights", torch.ones(2, 2)), "hook": os.getcwd}, unsafe_dir)

        loaded: dict[str, object] = {}
        loaded_outcome = outcome(lambda: loaded.update(load({"weights": sharded("weights", torch.zeros(2, 2))},
                                                            optimizer_dir)))
        expect(loaded_outcome == "ok", "a checkpoint holding torch.optim.AdamW loads weights-only", "ok",
               loaded_outcome)
        expect(loaded.get("optimizer_class") is torch.optim.AdamW, "the optimizer class comes back",
               torch.optim.AdamW, loaded.get("optimizer_class"))
        if context.native:
            return
        refused = outcome(lambda: load({"weights": sharded("weights", torch.zeros(2, 2))}, unsafe_dir))
        expect(refused != "ok" and "getcwd" in refused, "a checkpoint holding an arbitrary callable is still "
               "refused (weights_only stays on)", "an error naming os.getcwd", refused)
