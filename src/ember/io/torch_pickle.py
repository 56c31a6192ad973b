"""PyTorch checkpoints without torch: the zip format (torch >= 1.6) and the legacy format.

Zip: `<prefix>/data.pkl` is the pickled object; each storage it references by key lives,
uncompressed, in `<prefix>/data/<key>`. Legacy: five pickles back to back (magic number,
protocol version, sys info, the object, the list of storage keys), then for each key an int64
element count and the raw little-endian bytes.

Tensors come back as numpy arrays viewing the memory-mapped file (read-only; tensors that share
a storage share memory, offsets and strides honoured). `copy=True` copies each storage once into
writable memory instead. The unpickler resolves only tensor-rebuilding globals (see _unpickler).
"""

from __future__ import annotations

import io
import mmap
import os
import struct
import zipfile
from typing import Any

import numpy as np

from ember.io._common import fail, map_file
from ember.io._unpickler import Storage, restricted_load, show

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_ZIP_MAGIC = b"PK\x03\x04"


def load_torch(path: str | os.PathLike, *, copy: bool = False) -> Any:
    """Load a torch.save file: tensors become numpy arrays, containers stay dicts/lists/tuples."""
    path = os.fspath(path)
    mm, size = map_file(path, 4, "PyTorch checkpoint")
    head = mm[:4]
    if head == _ZIP_MAGIC:
        return _load_zip(path, mm, size, copy)
    if head[:1] == b"\x80":
        return _load_legacy(path, mm, size, copy)
    raise fail(
        path,
        f"expected a zip archive (b'PK\\x03\\x04') or a legacy torch pickle (b'\\x80...'), "
        f"found {head!r}; tar-format checkpoints (torch < 0.4) are not supported",
        0,
    )


def _view(mm: mmap.mmap, start: int, nbytes: int, dtype: np.dtype, copy: bool) -> np.ndarray:
    if nbytes == 0:
        return np.empty(0, dtype)
    arr = np.frombuffer(mm, np.uint8, nbytes, start).view(dtype)
    return arr.copy() if copy else arr


# --------------------------------------------------------------------------- zip format


def _load_zip(path: str, mm: mmap.mmap, size: int, copy: bool) -> Any:
    try:
        zf = zipfile.ZipFile(path)
        infos = {i.filename: i for i in zf.infolist()}
    except Exception as e:  # zipfile fails on hostile archives with many exception types
        raise fail(path, f"not a readable zip archive ({type(e).__name__}: {e})") from None
    pkls = [n for n in infos if n == "data.pkl" or (n.endswith("/data.pkl") and n.count("/") == 1)]
    if len(pkls) != 1:
        raise fail(path, f"expected one '<name>/data.pkl' record in the archive, found {pkls}")
    prefix = pkls[0][: -len("data.pkl")]

    def read_small(name: str, limit: int) -> bytes:
        info = infos[name]
        if info.file_size > limit or info.compress_type != zipfile.ZIP_STORED:
            raise fail(path, f"record {name!r}: expected at most {limit} stored bytes")
        try:
            return zf.read(info)
        except Exception as e:
            raise fail(path, f"record {name!r} is corrupt ({type(e).__name__}: {e})") from None

    if prefix + "byteorder" in infos:
        order = read_small(prefix + "byteorder", 16)
        if order != b"little":
            raise fail(path, f"expected byteorder b'little', found {order!r:.40}")
    pickle_bytes = read_small(pkls[0], size)
    storages: dict[str, np.ndarray] = {}

    def load_storage(pid: tuple) -> Storage:
        _, stype, key, _location, numel = pid[:5]
        name = f"{prefix}data/{key}"
        if name not in infos:
            raise fail(path, f"storage {show(key)} has no record {name!r} in the archive")
        if key not in storages:
            info = infos[name]
            nbytes = numel * stype.dtype.itemsize
            if info.file_size != nbytes:
                raise fail(
                    path,
                    f"record {name!r}: {numel} x {stype.dtype} needs {nbytes} bytes, "
                    f"the record holds {info.file_size}",
                )
            start = _record_start(path, mm, size, info)
            storages[key] = _view(mm, start, nbytes, np.dtype(np.uint8), copy)
        raw = storages[key]
        if raw.nbytes % stype.dtype.itemsize:
            raise fail(path, f"storage {show(key)} of {raw.nbytes} bytes read as {stype.dtype}")
        return Storage.of(raw.view(stype.dtype))

    try:
        return restricted_load(
            io.BytesIO(pickle_bytes),
            load_storage,
            f"{path}:{pkls[0]}",
            pickle_bytes=len(pickle_bytes),
            data_bytes=size,
        )
    finally:
        zf.close()


def _record_start(path: str, mm: mmap.mmap, size: int, info: zipfile.ZipInfo) -> int:
    """Absolute offset of a stored record's bytes, checked against the file."""
    name = info.filename
    if info.compress_type != zipfile.ZIP_STORED:
        raise fail(path, f"record {name!r} is compressed; torch.save stores records uncompressed")
    h = info.header_offset
    if h < 0 or h + 30 > size or mm[h : h + 4] != _ZIP_MAGIC:
        raise fail(path, f"record {name!r}: no local file header at its offset", h)
    n, m = struct.unpack_from("<HH", mm, h + 26)
    start = h + 30 + n + m
    if start + info.file_size > size:
        raise fail(
            path, f"record {name!r}: {info.file_size} bytes from {start} run past the end", h
        )
    return start


# --------------------------------------------------------------------------- legacy format


def _no_storage(pid: tuple) -> Storage:
    raise ValueError("a storage reference outside the main pickle")


def _load_legacy(path: str, mm: mmap.mmap, size: int, copy: bool) -> Any:
    mm.seek(0)
    magic = restricted_load(mm, _no_storage, f"{path}: magic number")
    if type(magic) is not int or magic != LEGACY_MAGIC:
        raise fail(path, f"expected the torch magic number {LEGACY_MAGIC:#x}, found {show(magic)}")
    proto = restricted_load(mm, _no_storage, f"{path}: protocol version")
    if type(proto) is not int or proto != LEGACY_PROTOCOL:
        raise fail(path, f"expected legacy protocol {LEGACY_PROTOCOL}, found {show(proto)}")
    sys_info = restricted_load(mm, _no_storage, f"{path}: sys info")
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise fail(path, f"expected a little-endian sys info dict, found {show(sys_info, 200)}")

    # Pass 1: learn every storage's dtype and size from the persistent ids, so the raw data
    # after the pickles can be located; tensors are checked against placeholder storages.
    start = mm.tell()
    records: dict[str, tuple[np.dtype, int]] = {}

    def record(pid: tuple) -> Storage:
        _, stype, key, _location, numel = pid[:5]
        dt = stype.dtype
        if numel * dt.itemsize > size:
            raise fail(path, f"storage {show(key)} claims {numel} x {dt}, more than the whole file")
        if records.setdefault(key, (dt, numel)) != (dt, numel):
            raise fail(path, f"storage {show(key)} is declared with two different types or sizes")
        _, n = _view_range(path, pid, numel)
        return Storage(None, dt, n)

    where = f"{path}: main pickle"
    restricted_load(mm, record, where)
    keys = restricted_load(mm, _no_storage, f"{path}: storage keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise fail(path, f"expected a list of storage keys, found {type(keys).__name__}")
    if len(set(keys)) != len(keys) or set(keys) != set(records):
        raise fail(
            path,
            f"storage keys {sorted(keys)[:8]} do not match the referenced {sorted(records)[:8]}",
        )

    # The raw storages, in key order: int64 element count, then the bytes.
    pos = mm.tell()
    located: dict[str, np.ndarray] = {}
    for key in keys:
        dt, numel = records[key]
        if pos + 8 > size:
            raise fail(path, f"file ends before the size of storage {show(key)}", pos)
        (n,) = struct.unpack_from("<q", mm, pos)
        if n != numel:
            raise fail(path, f"storage {show(key)}: expected {numel} elements, found {n}", pos)
        nbytes = numel * dt.itemsize
        if nbytes > size - pos - 8:
            raise fail(
                path, f"storage {show(key)}: {nbytes} bytes run past the end of the file", pos
            )
        located[key] = _view(mm, pos + 8, nbytes, dt, copy)
        pos += 8 + nbytes

    def resolve(pid: tuple) -> Storage:
        base = located[pid[2]]
        lo, n = _view_range(path, pid, base.size)
        return Storage.of(base[lo : lo + n])

    mm.seek(start)
    return restricted_load(mm, resolve, where)


def _view_range(path: str, pid: tuple, numel: int) -> tuple[int, int]:
    """(offset, size) of a legacy storage view `(view_key, offset, size)`, or the whole storage."""
    view = pid[5] if len(pid) == 6 else None
    if view is None:
        return 0, numel
    ok = isinstance(view, tuple) and len(view) == 3
    if ok:
        _, lo, n = view
        ok = type(lo) is int and type(n) is int and 0 <= lo and 0 <= n and lo + n <= numel
    if not ok:
        raise fail(path, f"bad storage view {show(view, 100)} of a {numel}-element storage")
    return lo, n
