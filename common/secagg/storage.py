"""Durable key-value storage that a site (and optionally the coordinator) persists protocol state in.

The protocol's safety across restarts rests on one rule: a party writes what
it is about to send or reveal for a round *before* it returns the message to
the transport.  Records are written once and compared on every later attempt,
so a restarted site re-sends byte-identical messages and can never produce a
second masked input, a second consistency signature or a second set of shares
for the same round.

The caller implements :class:`Storage` (the site daemon uses SQLite and commits
its privacy ledger in the same transaction).  Requirements:

* ``put`` is durable when it returns (fsync / committed transaction);
* ``get`` returns exactly the bytes last ``put`` (or ``None``);
* one process uses one storage at a time (no concurrent writers);
* the contents are secret (they hold private keys and shares): restrict access.

Keys are short ASCII paths such as ``"epoch/00000000000000000003/secrets"``.
Two implementations are provided: :class:`MemoryStorage` (tests, benchmarks,
simulation) and :class:`FileStorage` (one file per key, atomic replace, fsync).
"""
from __future__ import annotations

import os
import re
import tempfile
from typing import Protocol, runtime_checkable

from .errors import StorageError

_KEY_RE = re.compile(r"[a-z0-9_\-]+(/[a-z0-9_\-]+)*")


def check_key(key: str) -> str:
    """Keys are ``/``-separated path segments of ``[a-z0-9_-]``."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key) or len(key) > 200:
        raise StorageError(f"invalid storage key {key!r}")
    return key


@runtime_checkable
class Storage(Protocol):
    """Minimal durable key-value store; see the module docstring for the contract."""

    def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or ``None``."""

    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (overwriting); durable when it returns."""

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    def keys(self, prefix: str = "") -> list[str]:
        """All keys starting with ``prefix``, sorted."""


class MemoryStorage:
    """In-process :class:`Storage` (not durable across processes; shared between objects to simulate restarts)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self.writes = 0

    def get(self, key: str) -> bytes | None:
        return self._data.get(check_key(key))

    def put(self, key: str, value: bytes) -> None:
        if not isinstance(value, (bytes, bytearray)):
            raise StorageError("storage values must be bytes")
        self._data[check_key(key)] = bytes(value)
        self.writes += 1

    def delete(self, key: str) -> None:
        self._data.pop(check_key(key), None)

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self._data if k.startswith(prefix))


class FileStorage:
    """:class:`Storage` as one file per key under ``directory`` (mode 0600).

    ``put`` writes a temporary file, fsyncs it, renames it over the target
    (atomic on POSIX) and fsyncs the directory.  Path separators in keys map to
    ``.`` in file names, so the directory stays flat.
    """

    _SUFFIX = ".rec"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = os.fspath(directory)
        os.makedirs(self._dir, mode=0o700, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self._dir, check_key(key).replace("/", ".") + self._SUFFIX)

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {key!r}: {exc}") from exc

    def put(self, key: str, value: bytes) -> None:
        path = self._path(key)
        try:
            fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(bytes(value))
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, 0o600)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            dfd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise StorageError(f"cannot write {key!r}: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete {key!r}: {exc}") from exc

    def keys(self, prefix: str = "") -> list[str]:
        out = []
        for name in os.listdir(self._dir):
            if name.endswith(self._SUFFIX) and not name.startswith("."):
                key = name[: -len(self._SUFFIX)].replace(".", "/")
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)
