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
        # Names and their flags, one bool tensor [len(names)] an entry (a weight, or a grouped launch's weights).
        self._entries: list[tuple[list[str], torch.Tensor]] = []

    def record(self, name: str, flag: torch.Tensor) -> None:
        """``flag``: a 0-d bool tensor, True when weight ``name`` holds a NaN or an infinity."""
        self._entries.append(([name], flag.reshape(1)))

    def record_group(self, names: list[str], flags: torch.Tensor) -> None:
        """``flags``: a bool tensor ``[len(names)]``, one per weight (a grouped quantization's)."""
        self._entries.append((list(names), flags.reshape(len(names))))

    def raise_if_any(self) -> None:
        bad = [name for name, flag in self._read() if flag]
        self._entries.clear()
        if bad:
            name = bad[0]
            more = f" ({len(bad) - 1} more weights too)" if len(bad) > 1 else ""
            raise QATExportError(
                f"weight holds NaN or infinite values{more}; NVFP4 would pack them as the largest code",
                layer=name.removesuffix(".weight"),
                parameter=name,
                hint="the training step that produced these weights diverged; export an earlier one",
            )

    def _read(self) -> list[tuple[str, bool]]:
        """Every name with its flag, in recording order, with one device wait per device."""
        values: dict[int, list[bool]] = {}
        by_device: dict[torch.device, list[int]] = {}
        for index, (_, flags) in enumerate(self._entries):
            by_device.setdefault(flags.device, []).append(index)
        for indices in by_device.values():
            read = torch.cat([self._entries[i][1] for i in indices]).tolist()
            offset = 0
            for index in indices:
                count = len(self._entries[index][0])
                values[index] = [bool(v) for v in read[offset:offset + count]]
                offset += count
        return [(name, value) for index, (names, _) in enumerate(self._entries)
                for name, value in zip(names, values[index], strict=True)]
