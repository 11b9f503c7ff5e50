"""IDX files (the MNIST family's format), raw or gzip-compressed.

Layout: two zero bytes, a type code, the number of dimensions, one big-endian uint32 per dimension,
then the values in big-endian C order.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from edgefl.errors import ConfigError

_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_CODES = {np.dtype(v).newbyteorder("=").str[1:]: k for k, v in _TYPES.items()}


def read_idx(path) -> np.ndarray:
    """The array stored in an IDX file (gzip detected by its magic bytes, not by the name)."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _TYPES:
        raise ConfigError(f"{path} is not an IDX file (bad header); replace it with the original download")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    dtype = np.dtype(_TYPES[data[2]])
    count = int(np.prod(shape))
    if len(data) - 4 - 4 * ndim != count * dtype.itemsize:
        raise ConfigError(f"{path} is truncated (header says {shape}); replace it with the original download")
    array = np.frombuffer(data, dtype, count=count, offset=4 + 4 * ndim).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def write_idx(path, array: np.ndarray) -> Path:
    """Write `array` as IDX (gzip-compressed when the name ends in .gz); for fixtures and tests."""
    path, array = Path(path), np.asarray(array)
    code = _CODES[array.dtype.str[1:]]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.dtype(_TYPES[code])).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def find_idx(root: Path, stem: str):
    """The file for `stem` (e.g. train-images-idx3-ubyte) in root or in the layouts people unpack
    (npm's package/data, data/), raw or .gz, with '-' or '.' before idx; None if absent."""
    names = [stem, stem.replace("-idx", ".idx")]
    for folder in (root, root / "package" / "data", root / "data"):
        for name in names:
            for candidate in (folder / name, folder / f"{name}.gz"):
                if candidate.is_file():
                    return candidate
    return None
