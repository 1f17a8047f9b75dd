"""The permissions of the files camkit writes: what ``open()`` would give, not ``mkstemp``'s ``0o600``.

camkit writes files under a temporary name and renames them into place, so that no reader
sees half a file; :func:`file_mode` is the mode they are given before the rename.
"""

from __future__ import annotations

import os
import threading

__all__ = ["file_mode", "refresh_umask"]

_UMASK_LOCK = threading.Lock()
_UMASK: int | None = None


def file_mode() -> int:
    """The mode a new file gets from ``open()`` in this process: ``0o666`` less the umask.

    The umask is read once per process (reading it means setting it, which is not thread-safe).

    Example:
        >>> from camkit._internal.files import file_mode
        >>> file_mode() & 0o600
        384
    """
    global _UMASK
    with _UMASK_LOCK:
        if _UMASK is None:
            _UMASK = os.umask(0o022)
            os.umask(_UMASK)
        return 0o666 & ~_UMASK


def refresh_umask() -> None:
    """Read the process umask again (an audit or explain run calls this once as it starts)."""
    global _UMASK
    with _UMASK_LOCK:
        _UMASK = None
    file_mode()
