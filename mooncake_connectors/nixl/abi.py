"""Which nixl releases the MooncakeCore plugin was written for, and how to tell (pure logic).

Why both checks: NIXL's plugin ``api_version`` stayed 1 while the engine interface changed
across releases, so a plugin built for another release loads -- and then calls the wrong
virtual method. We therefore refuse a nixl whose *package version* is not one we checked, and
also one whose bundled plugins show an engine vtable of another size (the vtable object
``_ZTV17nixlBackendEngine`` that every bundled plugin carries: offset-to-top + RTTI + 27
methods + 2 destructor slots = 29 words in 1.5.1). The second check catches a locally built
nixl that claims a supported version but is not.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

#: nixl version -> engine vtable size in 8-byte words, for every release the plugin targets
SUPPORTED: dict[str, int] = {"1.5.1": 29}

#: the base engine class's vtable symbol (Itanium C++ ABI name), present in bundled plugins
VTABLE_SYMBOL = "_ZTV17nixlBackendEngine"
#: bundled plugins to read the vtable size from, in order of preference
PROBE_PLUGINS = ("libplugin_POSIX.so", "libplugin_UCX.so")


class NixlAbiMismatch(RuntimeError):
    """The installed nixl is not a release this plugin was written for."""


def supported_text() -> str:
    return ", ".join(f"{v} ({w}-word engine vtable)" for v, w in sorted(SUPPORTED.items()))


def check(version: str, vtable_words: int | None) -> None:
    """Raise NixlAbiMismatch (naming both versions) unless ``version`` / ``vtable_words``
    are one of SUPPORTED."""
    want = SUPPORTED.get(version)
    if want is None:
        raise NixlAbiMismatch(f"nixl {version} is installed, but the MooncakeCore plugin was written for nixl "
                              f"{supported_text()}; install nixl=={max(SUPPORTED)} or a mooncake-core release "
                              f"that supports nixl {version}")
    if vtable_words is None:
        raise NixlAbiMismatch(f"nixl {version}: no bundled plugin carries {VTABLE_SYMBOL}, so its backend ABI "
                              f"cannot be confirmed (expected the layout of nixl {supported_text()})")
    if vtable_words != want:
        raise NixlAbiMismatch(f"nixl {version} ships a {vtable_words}-word engine vtable, but the MooncakeCore "
                              f"plugin was written for nixl {version} with {want} words: this nixl build is "
                              "not the released one; install the released wheel")


# ------------------------------------------------------------------ ELF (64-bit little-endian)
_SHT_DYNSYM = 11


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def elf_symbol_size(data: bytes, name: str) -> int | None:
    """Size of dynamic symbol ``name`` in an ELF64 LE shared object's bytes, None if absent.
    ValueError if ``data`` is not such a file."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise ValueError("ELF section headers missing or truncated")
    secs = []
    for i in range(shnum):
        _n, typ, _f, _a, off, size, link, _i, _al, ent = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        secs.append(_Section(typ, off, size, link, ent))
    want = name.encode()
    for s in secs:
        if s.type != _SHT_DYNSYM or s.entsize < 24 or s.link >= len(secs):
            continue
        strtab = secs[s.link]
        strs = data[strtab.offset:strtab.offset + strtab.size]
        for off in range(s.offset, s.offset + s.size - 23, s.entsize):
            st_name, = struct.unpack_from("<I", data, off)
            end = strs.find(b"\0", st_name)
            if strs[st_name:end if end >= 0 else None] == want:
                size, = struct.unpack_from("<Q", data, off + 16)
                return size
    return None


def vtable_words(plugin_dir: Path) -> int | None:
    """Engine vtable size (8-byte words) read from the first bundled plugin that has it."""
    for fname in PROBE_PLUGINS:
        p = plugin_dir / fname
        if p.is_file():
            size = elf_symbol_size(p.read_bytes(), VTABLE_SYMBOL)
            if size is not None:
                return size // 8
    return None
