"""A device's local data, read a batch at a time: a folder with x.npy and y.npy, or an .npz holding x and y
(`numpy.savez`; `edgefl data export` writes the folder form).

Nothing holds the whole share: each batch's rows are read with pread from the file, so a training
process's peak RSS does not grow with the number of examples (a memory map would: every page it touches
stays in the process's resident set). The native trainer (device_runtime/native) reads the same way.

`open_local_data(path)` returns (x, y) as `Rows`: `len()`, `.shape`, `.dtype`, and indexing by an index
array or a slice gives a numpy array of those rows. y's rows are an example's targets: (N,) for a
classifier, (N, T) for a language model, whatever shape y.npy was saved in.

Data is checked before anything trains on it, since a runtime trains on garbage without a word (labels
past the classes gave a loss of -3e30; uint8 pixels of 0..255 were taken as normalised floats) or fails
with its own error text. `check_values` holds for any model: numbers, no NaN or infinity, integer labels
from 0 (-100 is the ignore index of language-model targets). `check_layout` holds for one artifact set
(`ModelInput.of`, from its manifests): x's per-example shape and dtype, targets per example and classes.
The checks read a bounded chunk at a time, as training does. The native trainer checks shapes, labels and
NaN itself as it reads, but converts any numbers, so its callers run these checks before it starts.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from edgefl.errors import ConfigError

HINT = "give a folder with x.npy and y.npy or an .npz (write one with 'edgefl data export')"
IGNORE_INDEX = -100          # torch's cross-entropy default: a target that counts for nothing
CHUNK_BYTES = 256 * 1024     # what a check holds at once: well below one training step's working set


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
            start, stop, step = index.indices(len(self))
            if step == 1:       # one read, with no per-row bookkeeping: what evaluation and the checks ask for
                out = self._read(start, max(stop - start, 0))
                return out.astype(self.dtype, copy=False)
            index = np.arange(start, stop, step)
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
            if flat is not None:
                flat[start:end] = self._read(int(index[start]), end - start).reshape(end - start, -1).view(np.uint8)
            start = end
        return out.astype(self.dtype, copy=False)

    def _read(self, first: int, count: int) -> np.ndarray:
        """Rows first..first+count-1 as stored, read straight into a fresh array."""
        out = np.empty((count, *self.row_shape), self.stored)
        if out.nbytes and os.preadv(self._fd, [memoryview(out).cast("B")],
                                    self.offset + first * self.row_bytes) != out.nbytes:
            raise ConfigError(f"{self.name}: the file ends early; write the data again")
        return out

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows as stored) over all rows, CHUNK_BYTES at a time (at least a row)."""
        step = max(1, CHUNK_BYTES // max(self.row_bytes, 1))
        for first in range(0, len(self), step):
            yield first, self._read(first, min(step, len(self) - first))


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
    if len(x) == 0:
        raise ConfigError(f"--data {x.name}: no examples (x has 0 rows); a device trains on at least one: {HINT}")
    if targets % len(x):
        raise ConfigError(f"{y.name}: x has {len(x)} examples and y {targets} targets; y needs a whole number of "
                          "targets per example")
    if len(y.shape) > 1 and y.shape[0] != len(x):
        raise ConfigError(f"{y.name}: {y.shape[0]} rows of targets, x has {len(x)} examples; give y one row of "
                          "targets per example of x")
    per_example = targets // len(x)
    return x, y.reshaped((per_example,) if per_example > 1 else ())


@dataclass(frozen=True)
class ModelInput:
    """What an artifact set trains on, as its manifests say."""
    row_shape: tuple            # one example of x
    dtype: np.dtype             # the model input's: float32 (images, features) or int64 (token ids)
    targets: int                # per example: 1 for a classifier, one per position for a token model
    classes: Optional[int]      # the logits' width; labels are 0..classes-1

    @classmethod
    def of(cls, artifacts) -> "ModelInput":
        """From an `edgefl.manifest.ArtifactSet`: the model's first input, the suffix's labels input (its last)
        and logits output (its second)."""
        first, suffix = (artifacts.prefix or artifacts.suffix).inputs[0], artifacts.suffix
        dtype, row = np.dtype(first.dtype), tuple(first.shape[1:])
        labels = suffix.inputs[-1].shape
        if all(isinstance(d, int) for d in labels) and suffix.batch_size:
            targets = int(np.prod(labels, dtype=np.int64)) // suffix.batch_size    # a fixed-batch program
        else:   # rows of logits per example, as edgefl.zoo's example_target gives them
            targets = int(np.prod(row, dtype=np.int64)) if dtype.kind in "iu" else 1
        logits = suffix.outputs[1].shape if len(suffix.outputs) > 1 else ()
        classes = logits[-1] if logits and isinstance(logits[-1], int) else None
        return cls(row, dtype, targets, classes)


def _numeric(x: Rows) -> None:
    if x.dtype.kind not in "fiu":
        raise ConfigError(f"{x.name}: values of dtype {x.dtype}; save x as float32 (images, features) or int64 "
                          "(token ids), as 'edgefl data export' does")


def check_layout(x: Rows, y: Rows, model: ModelInput) -> None:
    """x and y have the shape and kind of numbers `model` takes (the headers only: nothing is read)."""
    if tuple(x.row_shape) != tuple(model.row_shape):
        raise ConfigError(f"{x.name}: examples of shape {tuple(x.row_shape)}, the artifact takes "
                          f"{tuple(model.row_shape)}; export data for this model")
    _numeric(x)
    if model.dtype.kind == "f" and x.dtype.kind != "f":
        raise ConfigError(f"{x.name}: {x.dtype} values, the model takes {model.dtype} inputs; convert them as "
                          f"'edgefl data export' writes them (uint8 images: x.astype('float32') / 255)")
    if model.dtype.kind in "iu" and x.dtype.kind not in "iu":
        raise ConfigError(f"{x.name}: {x.dtype} values, the model takes {model.dtype} token ids; save x as int64")
    per_example = int(np.prod(y.row_shape, dtype=np.int64))
    if per_example != model.targets:
        want = f"({len(x)},)" if model.targets == 1 else f"({len(x)}, {model.targets})"
        raise ConfigError(f"{y.name}: {per_example} targets per example of x, the model trains on "
                          f"{model.targets}; give y of shape {want}")


def check_labels(y: Rows, classes: Optional[int] = None) -> None:
    """Every target an integer in 0..classes-1 (>= 0 without a model) or the ignore index."""
    if y.dtype.kind not in "iu":
        raise ConfigError(f"{y.name}: labels of dtype {y.dtype}; labels are class indices: save y as int64")
    for first, chunk in y.chunks():
        labels = chunk.reshape(len(chunk), -1).astype(np.int64, copy=False)
        bad = (labels < 0) if classes is None else (labels >= classes) | (labels < 0)
        bad &= labels != IGNORE_INDEX
        if bad.any():
            row = int(np.flatnonzero(bad.any(axis=1))[0])
            value = int(labels[row][bad[row]][0])
            where = f"{y.name}: target {value} of example {first + row}"
            if classes is None:
                raise ConfigError(f"{where} is negative; give class indices from 0 ({IGNORE_INDEX} to ignore one)")
            raise ConfigError(f"{where} is outside the model's {classes} classes; give labels 0..{classes - 1} "
                              f"({IGNORE_INDEX} to ignore one)")


def check_values(x: Rows, y: Rows, classes: Optional[int] = None) -> None:
    """x holds numbers, none NaN or infinite; y holds labels (`check_labels`). Reads both once, a chunk at a time."""
    _numeric(x)
    if x.dtype.kind == "f":
        for first, chunk in x.chunks():
            finite = np.isfinite(chunk.reshape(len(chunk), -1)).all(axis=1)
            if not finite.all():
                raise ConfigError(f"{x.name}: example {first + int(np.argmin(finite))} holds NaN or infinity; "
                                  "fix or drop it before training")
    check_labels(y, classes)


def load_data(path: Path, artifacts) -> tuple:
    """The local data at `path`, checked against the artifact set (an edgefl.manifest.ArtifactSet) before
    anything trains on it, read a batch at a time (edgefl.device_runtime.local_data): x as the model
    input's dtype, y one entry per example."""
    x, y = open_local_data(path)
    model = ModelInput.of(artifacts)
    check_layout(x, y, model)
    check_values(x, y, model.classes)
    return x.astype(model.dtype), y
