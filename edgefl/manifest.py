"""manifest.json: what an artifact folder holds, validated on read. numpy only (the device imports it).

An *artifact* is one folder: `manifest.json` plus the files it names. Two kinds:

* `prefix`: the frozen layers [0, frozen_prefix) as an inference graph (input: the model input; outputs:
  the boundary state, one tensor or several where a residual spans the cut). Its tensors are `frozen`.
* `suffix`: the trained layers [frozen_prefix, end) and the head, with their loss, as training artifacts.
  Inputs: the boundary state (or the model input when nothing is frozen), then `labels`; outputs: `loss`
  first, then `logits`. `trainable` lists every tensor the device uploads, in the order of the flat
  float32 upload buffer (`flatten` / `unflatten`): parameters (trained by gradient), BN statistics
  (updated by the forward pass) and BN batch counters. `prefix_id` is the id of the prefix it needs.

An artifact set, what a device receives and can be copied as it is, is a suffix folder with its prefix (if
any) in the subfolder `prefix/` (`ArtifactSet.open`). An artifact's id is the sha256 of its manifest.json
bytes: the manifest holds the sha256 of every file, so the id covers them all.

`Manifest.read(dir)` raises `ArtifactError` naming the file for a missing manifest or file, a size or
sha256 mismatch, a bad schema or a malformed field.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

import numpy as np

from edgefl.errors import ArtifactError, ReportRejected

SCHEMA = "edgefl.manifest/1"
MANIFEST = "manifest.json"
PREFIX_DIR = "prefix"
Kind = Literal["prefix", "suffix"]
TensorKind = Literal["parameter", "statistic", "counter"]
Dim = int | str          # a symbolic dimension ("batch", "batch*tokens") where a graph takes any size


try:   # Python's own SHA-256: hashlib's OpenSSL backend costs a device process ~3.7 MB of RSS
    from _sha2 import sha256 as _sha256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256 as _sha256  # Python 3.10, 3.11
    except ImportError:
        from hashlib import sha256 as _sha256


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = _sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    name: str           # relative to the artifact folder
    bytes: int
    sha256: str
    role: str           # e.g. model, training_model, eval_model, optimizer_model, checkpoint, program, weights


@dataclass(frozen=True)
class IOSpec:
    """A graph input or output."""
    name: str
    shape: tuple[Dim, ...]
    dtype: str          # numpy dtype name: float32, int64


@dataclass(frozen=True)
class TensorEntry:
    """A tensor the artifact holds: its global name (edgefl.server.submodel), the runtime's own name for it,
    and how it changes in training (parameter, statistic, counter)."""
    name: str
    local: str
    shape: tuple[int, ...]
    dtype: str
    kind: TensorKind = "parameter"

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer a suffix trains with; the learning rate comes with every step. The defaults are the
    torch Trainer's (edgefl.device_runtime.trainers.torch_trainer): torch.optim.SGD(momentum=0.9,
    weight_decay=1e-5) and torch.optim.AdamW's own defaults."""
    name: Literal["sgd", "adamw"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    @classmethod
    def for_optimizer(cls, name: str) -> "OptimizerSpec":
        if name == "sgd":
            return cls("sgd")
        if name == "adamw":
            return cls("adamw", momentum=0.0, weight_decay=1e-2)
        raise ValueError(f"unknown optimizer {name!r}")


@dataclass(frozen=True)
class Manifest:
    kind: Kind
    backend: str
    versions: Mapping[str, str]                 # runtime and exporter versions
    model: Mapping[str, Any]                     # ModelRef JSON
    config: Mapping[str, Any]                    # TrainConfig JSON
    config_hash: str
    files: tuple[FileEntry, ...]
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    trainable: tuple[TensorEntry, ...] = ()      # uploaded, in flat-buffer order (suffix)
    frozen: tuple[TensorEntry, ...] = ()         # held, never uploaded (prefix weights and statistics)
    batch_size: int = 32                         # the batch the memory plan (and `predicted`) assumes
    prefix_batch: int = 0                        # samples to run through the prefix at once (0: the whole batch)
    predicted: Optional[Mapping[str, Any]] = None   # Cost JSON of the config on this backend's runtime
    prefix_id: Optional[str] = None              # id of the prefix artifact a suffix needs
    weights_version: int = 0
    optimizer: Optional[OptimizerSpec] = None    # suffix only
    extra: Mapping[str, Any] = field(default_factory=dict)   # backend-specific (documented by the backend)
    schema: str = SCHEMA

    # ------------------------------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        d = asdict(self)
        d["optimizer"] = asdict(self.optimizer) if self.optimizer else None
        return {"schema": d.pop("schema"), **d}

    def dumps(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    @property
    def id(self) -> str:
        """sha256 of manifest.json as written: names the artifact and, through the file hashes, its content."""
        return _sha256(self.dumps()).hexdigest()

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST) -> "Manifest":
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            found = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise ArtifactError(f"{where}: schema is {found!r}, expected {SCHEMA!r}; re-export the artifact "
                                "with this edgefl version")
        try:
            opt = d.get("optimizer")
            m = cls(kind=d["kind"], backend=d["backend"], versions=dict(d["versions"]), model=dict(d["model"]),
                    config=dict(d["config"]), config_hash=str(d["config_hash"]),
                    files=tuple(FileEntry(**f) for f in d["files"]),
                    inputs=tuple(IOSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in d["inputs"]),
                    outputs=tuple(IOSpec(o["name"], tuple(o["shape"]), o["dtype"]) for o in d["outputs"]),
                    trainable=tuple(_tensor(t) for t in d.get("trainable", [])),
                    frozen=tuple(_tensor(t) for t in d.get("frozen", [])),
                    batch_size=int(d["batch_size"]), prefix_batch=int(d.get("prefix_batch", 0)),
                    predicted=d.get("predicted"), prefix_id=d.get("prefix_id"),
                    weights_version=int(d.get("weights_version", 0)),
                    optimizer=OptimizerSpec(**{**opt, "betas": tuple(opt["betas"])}) if opt else None,
                    extra=dict(d.get("extra", {})))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(f"{where}: malformed manifest ({type(exc).__name__}: {exc}); re-export the "
                                "artifact") from None
        if m.kind not in ("prefix", "suffix"):
            raise ArtifactError(f"{where}: kind is {m.kind!r}, expected 'prefix' or 'suffix'")
        if m.kind == "suffix" and (m.optimizer is None or [o.name for o in m.outputs[:1]] != ["loss"]):
            raise ArtifactError(f"{where}: a suffix needs an optimizer and 'loss' as its first output; re-export it")
        return m

    # ------------------------------------------------------------------------------------- on disk
    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / MANIFEST
        path.write_bytes(self.dumps())
        return path

    @classmethod
    def read(cls, folder: str | Path, verify: bool = True) -> "Manifest":
        """The manifest of an artifact folder; with `verify`, every file it names is checked (size, sha256)."""
        path = Path(folder) / MANIFEST
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ArtifactError(f"{path}: missing; not an artifact folder (export one with 'edgefl export')") from None
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot read it ({exc.strerror})") from None
        except ValueError as exc:
            raise ArtifactError(f"{path}: not JSON ({exc}); re-export or re-download the artifact") from None
        manifest = cls.from_json(data, str(path))
        if verify:
            manifest.verify(folder)
        return manifest

    def verify(self, folder: str | Path) -> None:
        for f in self.files:
            path = Path(folder) / f.name
            if Path(f.name).is_absolute() or ".." in Path(f.name).parts:
                raise ArtifactError(f"{Path(folder) / MANIFEST}: file name {f.name!r} leaves the artifact folder")
            if not path.is_file():
                raise ArtifactError(f"{path}: named in the manifest but missing; re-export or re-download the artifact")
            size = path.stat().st_size
            if size != f.bytes:
                raise ArtifactError(f"{path}: {size} bytes, the manifest says {f.bytes}; the file is truncated or "
                                    "was changed: re-export or re-download the artifact")
            if sha256_file(path) != f.sha256:
                raise ArtifactError(f"{path}: sha256 does not match the manifest; the file is corrupt or was "
                                    "changed: re-export or re-download the artifact")

    def with_files(self, folder: str | Path, roles: Mapping[str, str]) -> "Manifest":
        """This manifest with `files` describing `roles` (file name -> role) as they are now on disk."""
        entries = tuple(FileEntry(name, (Path(folder) / name).stat().st_size, sha256_file(Path(folder) / name), role)
                        for name, role in roles.items())
        return replace(self, files=entries)

    def file(self, role: str) -> str:
        """Name of the (first) file with `role`."""
        for f in self.files:
            if f.role == role:
                return f.name
        raise ArtifactError(f"{MANIFEST}: no file with role {role!r} (has {', '.join(f.role for f in self.files)})")

    @property
    def upload_bytes(self) -> int:
        return 4 * sum(t.numel for t in self.trainable)

    @property
    def artifact_bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def _tensor(t: dict) -> TensorEntry:
    return TensorEntry(t["name"], t["local"], tuple(int(n) for n in t["shape"]), t["dtype"], t.get("kind", "parameter"))


# ----------------------------------------------------------------------------------- flat buffers

def _in_order(entries: Sequence[TensorEntry], tensors: Mapping[str, np.ndarray] | Callable[[TensorEntry], np.ndarray]):
    """Each entry's tensor (by global name, or read one entry at a time), flat, checked against the manifest's
    shape: one tensor at a time, so a reader that copies holds one tensor's copy at once."""
    read = tensors if callable(tensors) else (lambda e: tensors[e.name])
    for e in entries:
        t = np.asarray(read(e))
        if t.shape != e.shape:
            raise ValueError(f"tensor {e.name}: shape {t.shape}, the manifest says {e.shape}")
        yield e, t.reshape(-1)


def flatten(entries: Sequence[TensorEntry],
            tensors: Mapping[str, np.ndarray] | Callable[[TensorEntry], np.ndarray]) -> np.ndarray:
    """One float32 buffer holding `tensors` in `entries` order (counters as float32: exact below 2**24). Each
    tensor is copied into the buffer as it is read, so the buffer is the only whole copy."""
    out = np.empty(sum(e.numel for e in entries), np.float32)
    offset = 0
    for e, t in _in_order(entries, tensors):
        out[offset:offset + e.numel] = t
        offset += e.numel
    return out


def write_flat(path: str | Path, entries: Sequence[TensorEntry],
               tensors: Mapping[str, np.ndarray] | Callable[[TensorEntry], np.ndarray]) -> int:
    """`flatten`'s buffer written to `path` as a 1-D float32 .npy file a tensor at a time, never whole in memory:
    what a device's round writes for its upload (building the buffer first set VGG-11's peak: its 31.5 MiB of
    trained weights on top of what the steps left resident). Returns the bytes of values written."""
    count = sum(e.numel for e in entries)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (count,)})
        for _, t in _in_order(entries, tensors):
            f.write(np.ascontiguousarray(t, dtype="<f4").data)   # a copy of this one tensor at most
    return 4 * count


def unflatten(entries: Sequence[TensorEntry], buffer: np.ndarray) -> dict[str, np.ndarray]:
    """{global name: array} out of a flat float32 upload buffer in `entries` order, each in its own dtype."""
    buffer = np.asarray(buffer)
    expected = sum(e.numel for e in entries)
    if buffer.ndim != 1 or buffer.size != expected:
        raise ReportRejected(f"upload buffer holds {buffer.size} values, the manifest's trained tensors "
                             f"{expected}")
    out, offset = {}, 0
    for e in entries:
        out[e.name] = buffer[offset:offset + e.numel].reshape(e.shape).astype(e.dtype)
        offset += e.numel
    return out


# --------------------------------------------------------------------------------- artifact sets

@dataclass(frozen=True)
class ArtifactSet:
    """What a device trains from: a suffix artifact and, when layers are frozen, its prefix artifact."""
    folder: Path
    suffix: Manifest
    prefix_folder: Optional[Path] = None
    prefix: Optional[Manifest] = None

    @classmethod
    def open(cls, folder: str | Path, verify: bool = True) -> "ArtifactSet":
        """Read and check a set folder: the suffix manifest, and `prefix/` when the suffix names a prefix
        (its id must match)."""
        folder = Path(folder)
        suffix = Manifest.read(folder, verify)
        if suffix.kind != "suffix":
            raise ArtifactError(f"{folder / MANIFEST}: a {suffix.kind} artifact; give the artifact set folder "
                                "(the one holding the suffix manifest)")
        if suffix.prefix_id is None:
            return cls(folder, suffix)
        pdir = folder / PREFIX_DIR
        prefix = Manifest.read(pdir, verify)
        if prefix.id != suffix.prefix_id:
            raise ArtifactError(f"{pdir / MANIFEST}: id {prefix.id[:16]} is not the prefix the suffix needs "
                                f"({suffix.prefix_id[:16]}); copy the set folder again")
        return cls(folder, suffix, pdir, prefix)

    @property
    def runtime(self) -> str:
        return self.suffix.backend
