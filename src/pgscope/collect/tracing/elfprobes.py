"""USDT (SystemTap SDT) probes compiled into a binary, read from its `.note.stapsdt` notes.

Works on stripped binaries: the notes are not debug information. Each note's descriptor is
pc, base and semaphore addresses (3 x 8 bytes on 64-bit), then provider, name and argument
format as NUL-terminated strings.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection


@dataclass(frozen=True)
class UsdtProbe:
    provider: str
    name: str
    semaphore: int  # 0 when the probe is unconditional; else a counter a tracer must raise
    arguments: str


def list_probes(binary: Path) -> list[UsdtProbe]:
    """All USDT probes of `binary`; empty when it has none. Raises OSError if unreadable."""
    with binary.open("rb") as handle:
        try:
            elf = ELFFile(handle)
        except ELFError:
            return []
        section = elf.get_section_by_name(".note.stapsdt")
        if not isinstance(section, NoteSection):
            return []
        word = 8 if elf.elfclass == 64 else 4
        fmt = ("<" if elf.little_endian else ">") + ("QQQ" if word == 8 else "III")
        probes = []
        for note in section.iter_notes():
            desc = note["n_desc"]
            if note["n_name"] != "stapsdt" or not isinstance(desc, bytes):
                continue
            _pc, _base, semaphore = struct.unpack_from(fmt, desc)
            provider, name, arguments = [*desc[3 * word :].split(b"\0"), b"", b""][:3]
            probes.append(
                UsdtProbe(provider.decode(), name.decode(), semaphore, arguments.decode())
            )
        return probes
