"""The provided Storage implementations honour the contract the site relies on."""
from __future__ import annotations

import os
import stat

import pytest

from fedsbdt.common.secagg import FileStorage, MemoryStorage, Storage, StorageError


@pytest.fixture(params=["memory", "file"])
def storage(request, tmp_path):
    return MemoryStorage() if request.param == "memory" else FileStorage(tmp_path / "state")


def test_contract(storage):
    assert isinstance(storage, Storage)
    assert storage.get("round/00000000000000000001/input") is None
    storage.put("round/00000000000000000001/input", b"abc")
    storage.put("round/00000000000000000002/input", b"")
    storage.put("epoch/00000000000000000000/secrets", b"\x00\xff")
    assert storage.get("round/00000000000000000001/input") == b"abc"
    assert storage.get("round/00000000000000000002/input") == b""
    storage.put("round/00000000000000000001/input", b"xyz")  # overwrite
    assert storage.get("round/00000000000000000001/input") == b"xyz"
    assert storage.keys("round/") == ["round/00000000000000000001/input", "round/00000000000000000002/input"]
    assert storage.keys() == sorted(storage.keys())
    storage.delete("round/00000000000000000001/input")
    storage.delete("round/00000000000000000001/input")  # deleting twice is fine
    assert storage.keys("round/") == ["round/00000000000000000002/input"]
    for bad in ("", "Upper/case", "a//b", "../escape", "a b", "x" * 300):
        with pytest.raises(StorageError):
            storage.put(bad, b"")


def test_file_storage_persists_and_is_private(tmp_path):
    a = FileStorage(tmp_path / "s")
    a.put("meta/watermark", b"123")
    b = FileStorage(tmp_path / "s")  # a new process on the same directory
    assert b.get("meta/watermark") == b"123"
    path = next(p for p in (tmp_path / "s").iterdir())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not [p for p in os.listdir(tmp_path / "s") if p.startswith(".tmp-")]  # no leftovers
