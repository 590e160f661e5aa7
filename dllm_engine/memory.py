"""Handing freed memory back to the operating system.

Every engine request allocates its own KV cache (fp16 on the fused CPU pass: 23 KB a token for
SmolLM2, so 15-40 MB for a voice prompt and its reply), and a voice session submits several a
turn (drafts, end-of-turn verdicts, the reply). glibc's malloc serves allocations under its
dynamic mmap threshold (which grows up to 32 MB as large blocks are freed) from its heaps, and
a heap only shrinks from the top: caches of varying sizes leave free holes that stay resident.
`malloc_trim(0)` returns them (it also madvises free pages inside a heap). The engine calls
it when it goes idle, at most every few seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_trim = None
_looked_up = False


def release_free_memory() -> bool:
    """glibc's malloc_trim(0); False where there is no glibc (macOS, musl) and nothing is done."""
    global _trim, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            log.debug("no malloc_trim here: freed memory stays with the allocator")
    return bool(_trim is not None and _trim(0) >= 0)
