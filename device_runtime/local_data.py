"""A device's local data, read a batch at a time: a folder with x.npy and y.npy, or an .npz holding x and y
(`numpy.savez`; `edgefl data export` writes the folder form).

Nothing holds the whole share: each batch's rows are read with pread from the file, so a training
process's peak RSS does not grow with the number of examples (a memory map would: every page it touches
stays in the process's resident set). The native trainer (device_runtime/native) reads the same way.

`open_local_data(path)` returns (x, y) as `Rows`: `len()`, `.shape`, `.dtype`, and indexing by an index
array or a slice gives a numpy array of those rows. y's rows are an example's targets: (N,) for a
classifier, (N, T) for a language model, whatever shape y.npy was saved in.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from edgefl.errors import ConfigError

HINT = "give a folder with x.npy and y.npy or an .npz (write one with 'edgefl data export')"


class Rows:
    """The rows of an array stored in a file at `offset` (C order), read on demand."""

    def __init__(self, path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...], name: str,
                 as_dtype: np.dtype | None = None):
        self.path, self.offset, self.stored, self.shape, self.name = path, offset, np.dtype(dtype), shape, name
        self.dtype = np.dtype(as_dtype or dtype)    # what indexing returns: converted a batch at a time
        self.row_shape = shape[1:]
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.stored.itemsize
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    def reshaped(self, row_shape: tuple[int, ...]) -> "Rows":
        """The same values seen as rows of `row_shape` (a flat (N*T,) y as N rows of T targets)."""
        values = int(np.prod(self.shape, dtype=np.int64))
        rows = values // max(int(np.prod(row_shape, dtype=np.int64)), 1)
        return Rows(self.path, self.offset, self.stored, (rows, *row_shape), self.name, self.dtype)

    def astype(self, dtype) -> "Rows":
        """The same rows, returned as `dtype`."""
        return Rows(self.path, self.offset, self.stored, self.shape, self.name, np.dtype(dtype))

    def head(self, n: int) -> "Rows":
        """The first `n` rows."""
        return Rows(self.path, self.offset, self.stored, (min(n, len(self)), *self.row_shape), self.name, self.dtype)

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self)))
        index = np.asarray(index, np.int64).reshape(-1)
        out = np.empty((len(index), *self.row_shape), self.stored)
        flat = out.reshape(len(index), -1).view(np.uint8) if self.row_bytes else None
        # consecutive rows are read in one call: a sorted batch or an evaluation slice is a few reads
        start = 0
        while start < len(index):
            end = start + 1
            while end < len(index) and index[end] == index[end - 1] + 1:
                end += 1
            if index[start] < 0 or index[end - 1] >= len(self):
                raise IndexError(f"{self.name}: row {index[start]} of {len(self)}")
            want = (end - start) * self.row_bytes
            data = os.pread(self._fd, want, self.offset + int(index[start]) * self.row_bytes)
            if len(data) != want:
                raise ConfigError(f"{self.name}: the file ends early; write the data again")
            if flat is not None:
                flat[start:end] = np.frombuffer(data, np.uint8).reshape(end - start, self.row_bytes)
            start = end
        return out.astype(self.dtype, copy=False)


def _rows(handle, path: Path, name: str) -> Rows:
    """The .npy array whose header starts at the position of the open file `handle`."""
    try:
        version = np.lib.format.read_magic(handle)
        # format 3.0 differs from 2.0 only in allowing UTF-8 field names, which rows of numbers never have
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(handle)
    except ValueError as exc:
        raise ConfigError(f"--data {name}: not numpy data ({exc}); {HINT}") from None
    if fortran and len(shape) > 1:
        raise ConfigError(f"--data {name}: saved in Fortran order; save it with numpy.save from a C-ordered array")
    if dtype.hasobject or dtype.byteorder == ">":
        raise ConfigError(f"--data {name}: dtype {dtype} is not supported; save the data as float32, uint8 or int64")
    if len(shape) == 0:
        raise ConfigError(f"--data {name}: a scalar, not one row per example; {HINT}")
    return Rows(path, handle.tell(), dtype, tuple(shape), name)


def _npy(path: Path) -> Rows:
    with open(path, "rb") as f:
        return _rows(f, path, str(path))


def _npz(path: Path, key: str) -> Rows:
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"--data {path}: not numpy data ({exc}); {HINT}") from None
    with archive:
        try:
            info = archive.getinfo(f"{key}.npy")
        except KeyError:
            raise ConfigError(f"--data {path}: no array {key!r}; the .npz must hold arrays x and y") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise ConfigError(f"--data {path}: member {key}.npy is compressed; save the data with numpy.savez (not "
                              "savez_compressed) or as x.npy and y.npy")
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
            if local[:4] != b"PK\x03\x04":
                raise ConfigError(f"--data {path}: a damaged archive; write the data again")
            name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
            f.seek(info.header_offset + 30 + name_len + extra_len)
            return _rows(f, path, f"{path}:{key}")


def open_local_data(path: Path) -> tuple[Rows, Rows]:
    path = Path(path)
    try:
        if path.is_dir():
            x, y = _npy(path / "x.npy"), _npy(path / "y.npy")
        else:
            x, y = _npz(path, "x"), _npz(path, "y")
    except FileNotFoundError as exc:
        raise ConfigError(f"--data {path}: {Path(exc.filename).name if exc.filename else path} not found; "
                          f"{HINT}") from None
    targets = int(np.prod(y.shape, dtype=np.int64))
    if len(x) == 0 or targets % len(x):
        raise ConfigError(f"--data {path}: x has {len(x)} examples and y {targets} targets; y needs a whole number "
                          "of targets per example")
    per_example = targets // len(x)
    return x, y.reshaped((per_example,) if per_example > 1 else ())
