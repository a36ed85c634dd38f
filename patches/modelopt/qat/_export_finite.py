"""NaN and infinite weights in a QAT export, reported once the stream has ended.

A diverged training step leaves NaN or infinite weights. NVFP4 packs them as the largest code
without complaint, and vLLM would serve them. The quantization pass flags each weight on its own
device (``_nvfp4_pack.quantize_nvfp4(nonfinite=...)``). Reading each flag as its weight goes by
would make the host wait for the device once per weight, which serialises the fused export's
kernel launches (measured on an H200: 0.655x of a plain copy's throughput fell to 0.345x). So the
flags are read together, with one wait, after the last tensor: the stream then raises
:class:`QATExportError` naming the first bad weight instead of ending. A consumer that applies the
stream all-or-nothing (a vLLM refit through patchkit) rolls back; one that writes files must drop
what it wrote. Quantized weights are checked; tensors exported as they are (norms, embeddings)
are not, which would cost a read pass of their own.
"""

from __future__ import annotations

import torch

from .._errors import QATExportError


class NonFiniteWeights:
    """The device flags of one export's quantized weights, read at the end (:meth:`raise_if_any`)."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._flags: list[torch.Tensor] = []

    def record(self, name: str, flag: torch.Tensor) -> None:
        """``flag``: a 0-d bool tensor, True when weight ``name`` holds a NaN or an infinity."""
        self._names.append(name)
        self._flags.append(flag.reshape(()))

    def raise_if_any(self) -> None:
        bad = [name for name, flag in zip(self._names, self._read(), strict=True) if flag]
        self._names.clear()
        self._flags.clear()
        if bad:
            name = bad[0]
            more = f" ({len(bad) - 1} more weights too)" if len(bad) > 1 else ""
            raise QATExportError(
                f"weight holds NaN or infinite values{more}; NVFP4 would pack them as the largest code",
                layer=name.removesuffix(".weight"),
                parameter=name,
                hint="the training step that produced these weights diverged; export an earlier one",
            )

    def _read(self) -> list[bool]:
        """All flags, with one device wait per device."""
        values: list[bool] = [False] * len(self._flags)
        by_device: dict[torch.device, list[int]] = {}
        for index, flag in enumerate(self._flags):
            by_device.setdefault(flag.device, []).append(index)
        for indices in by_device.values():
            for index, value in zip(indices, torch.stack([self._flags[i] for i in indices]).tolist(), strict=True):
                values[index] = bool(value)
        return values
