"""Output files the user names: checked first, written atomically, nothing left behind on failure.

Every command that writes a file the user named (``--out``) goes through
:func:`write_atomic`: the destination is checked before anything is written
(not a directory, a file name, an existing parent folder), the bytes go to a
uniquely named hidden temporary file beside it and replace the destination in one
``rename``.  A failure removes the temporary file and raises
:class:`OutputError` naming the path the user gave, never the temporary one.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path


class OutputError(ValueError):
    """An output path cannot be written (a folder, a missing folder, no permission, disk full)."""


def check_output_path(path: str | Path, what: str = "output file") -> Path:
    """``path`` as a :class:`Path` if a file can be created or replaced there, else :class:`OutputError`."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{path} is a folder, not a file name for the {what}")
    if str(path).endswith(os.sep) or p.name in ("", ".", ".."):
        raise OutputError(f"{path} is not a file name for the {what}")
    if not p.parent.is_dir():
        raise OutputError(f"{path}: folder {p.parent} does not exist (create it first)")
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: no permission to write in folder {p.parent}")
    return p


def write_atomic(path: str | Path, data: str | bytes, what: str = "output file") -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; returns the path.  The file gets the usual
    permissions (0666 minus the umask); secrets are written elsewhere (``fedsbdt.common.federation.pki.write_private``)."""
    p = check_output_path(path, what)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"{path}: cannot write the {what}: {e.strerror or e}") from None
    return p


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as 64 hex digits (a model's hash in receipts and logs)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
