"""Hand-written PyTorch checkpoints (zip and legacy) with arbitrary, possibly hostile, pickles."""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile

import torch

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class FakeStorage:
    """Pickled as a persistent id ('storage', storage_type, key, 'cpu', numel)."""

    def __init__(
        self, key: str, storage_type: type = torch.FloatStorage, numel: int = 4, view=None
    ) -> None:
        self.key, self.storage_type, self.numel, self.view = key, storage_type, numel, view


class FakeTensor:
    """Pickled exactly as torch pickles a tensor, with any layout we like."""

    def __init__(self, storage: FakeStorage, offset=0, size=(4,), stride=(1,)) -> None:
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class _Pickler(pickle.Pickler):
    legacy = False

    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            pid = ("storage", obj.storage_type, obj.key, "cpu", obj.numel)
            return (*pid, obj.view) if self.legacy else pid
        return None


def dumps(obj, legacy: bool = False) -> bytes:
    """Pickle with protocol 2, as torch.save does, turning FakeStorage into persistent ids.

    Legacy files carry a sixth pid item: None or a storage view (view_key, offset, size).
    """
    buf = io.BytesIO()
    p = _Pickler(buf, protocol=2)
    p.legacy = legacy
    p.dump(obj)
    return buf.getvalue()


def zip_checkpoint(pickle_bytes: bytes, storages: dict[str, bytes]) -> bytes:
    """A torch zip checkpoint holding the given data.pkl and raw storage records."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def legacy_checkpoint(pickle_bytes: bytes, storages: dict[str, tuple[int, bytes]]) -> bytes:
    """A legacy checkpoint: magic, protocol, sys info, main pickle, keys, (numel, raw) each."""
    sys_info = {"protocol_version": 1001, "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 8}}  # fmt: skip
    out = [pickle.dumps(LEGACY_MAGIC, 2), pickle.dumps(1001, 2), pickle.dumps(sys_info, 2)]
    out += [pickle_bytes, pickle.dumps(list(storages), 2)]
    for numel, raw in storages.values():
        out += [struct.pack("<q", numel), raw]
    return b"".join(out)
