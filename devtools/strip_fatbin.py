"""Zero the GPU code of other architectures in a CUDA shared library, so it compresses small.

Why: the device machine is an H100 (sm_90) and a call may carry 64 MiB. TransformerEngine's core
library and vLLM's kernel libraries hold cubins for every architecture they support (hundreds of
MB); only the sm_90 ones can run there. Zeroing the *payload* of every other cubin, in place, keeps
the file's size, its ELF layout and every fatbin header (so the CUDA driver still parses the
fatbins and picks the sm_90 entry), and the zeroed runs compress to nothing with zstd.

PTX entries are kept: a kernel shipped only as PTX for an older architecture is JIT-compiled for
sm_90 by the driver, and zeroing it would break that kernel.

Fatbin layout (as read by cuobjdump; little endian): a 16-byte header (u32 magic 0xBA55ED50, u16
version, u16 header size, u64 size of the entries), then entries, each a header (u16 kind: 1 PTX,
2 ELF; u16; u32 header size; u64 payload size; ...; u32 architecture at offset 28) followed by its
payload. The fatbins sit one after another, aligned, in the ELF section ``.nv_fatbin``.

Usage: ``python3 devtools/strip_fatbin.py LIB.so [--keep-arch 90]`` (rewrites the file in place).
"""

from __future__ import annotations

import argparse
import logging
import struct
from collections import Counter
from pathlib import Path

logger = logging.getLogger("strip_fatbin")

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def fatbin_section(data: bytes | bytearray) -> tuple[int, int]:
    """``(offset, size)`` of the ELF64 section ``.nv_fatbin``; ``(0, 0)`` if the file has none."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    str_off, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    for index in range(shnum):
        header = shoff + index * shentsize
        name_off, = struct.unpack_from("<I", data, header)
        end = data.index(b"\0", str_off + name_off)
        if bytes(data[str_off + name_off:end]) == b".nv_fatbin":
            offset, size = struct.unpack_from("<QQ", data, header + 0x18)
            return offset, size
    return 0, 0


def zero_other_cubins(data: bytearray, keep_arch: int) -> Counter[str]:
    """Zero, in ``data``, the payload of every ELF entry whose architecture is not ``keep_arch``.

    Returns counts of what was seen (``kept sm_90``, ``zeroed sm_80``, ``ptx compute_80``...).
    """
    seen: Counter[str] = Counter()
    start, size = fatbin_section(data)
    position, end = start, start + size
    while position + 16 <= end:
        magic, = struct.unpack_from("<I", data, position)
        if magic != FATBIN_MAGIC:
            position += 8  # fatbins are 8-byte aligned; skip padding
            continue
        _version, header_size, entries_size = struct.unpack_from("<HHQ", data, position + 4)
        entry = position + header_size
        entries_end = entry + entries_size
        while entry < entries_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            body = entry + entry_header
            if kind == KIND_ELF and arch != keep_arch:
                data[body:body + payload] = bytes(payload)
                seen[f"zeroed sm_{arch}"] += 1
            elif kind == KIND_ELF:
                seen[f"kept sm_{arch}"] += 1
            else:
                seen[f"ptx compute_{arch}"] += 1
            entry = body + payload
        position = entries_end
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="+", type=Path)
    parser.add_argument("--keep-arch", type=int, default=90)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for library in args.libraries:
        data = bytearray(library.read_bytes())
        seen = zero_other_cubins(data, args.keep_arch)
        library.write_bytes(data)
        logger.info("%s: %s", library, dict(sorted(seen.items())))


if __name__ == "__main__":
    main()
