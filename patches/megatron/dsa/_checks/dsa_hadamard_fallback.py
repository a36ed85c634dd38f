"""Self-check of ``megatron.dsa_hadamard_fallback``: upstream's DSA ``rotate_activation`` runs and rotates."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

#: Inputs as the DSA indexer rotates them, bf16 (``rotate_activation`` accepts nothing else): queries
#: ``[seq, batch, heads, head_dim]`` and keys ``[seq, batch, head_dim]``, head_dim 128 as DeepSeek-V3.2's
#: indexer; then a head_dim that is not a power of two, which the transform pads.
SHAPES = ((5, 2, 4, 128), (5, 2, 128), (3, 1, 96))


def check_dsa_hadamard_fallback(context: CheckContext) -> None:
    """``dsa.rotate_activation(x)`` returns ``H x / sqrt(d)`` (``H`` the Sylvester Hadamard matrix)
    for the indexer's shapes, with the installed ``fast_hadamard_transform`` or the patch's fallback.

    Upstream without the package fails its assert "fast_hadamard_transform is not installed."
    """
    import torch

    from ._rotation import expected_rotation, rounding_excess, upstream_rotation

    generator = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        x = torch.randn(shape, generator=generator).to(device=context.device, dtype=torch.bfloat16)
        rotation = upstream_rotation(x)
        expect(rotation.error is None, f"rotate_activation on a bf16 {list(shape)} tensor", "a result",
               rotation.error)
        assert rotation.result is not None
        expect(rotation.result.shape == x.shape and rotation.result.dtype == x.dtype,
               f"rotate_activation's result for {list(shape)}", (tuple(x.shape), x.dtype),
               (tuple(rotation.result.shape), rotation.result.dtype))
        excess = rounding_excess(rotation.result, expected_rotation(x), x, shape[-1] ** -0.5)
        expect(excess <= 1.0, f"rotate_activation on {list(shape)} against H x / sqrt(d)",
               "within float32 arithmetic stored in bf16 (excess <= 1)", f"excess {excess:.2f}")
