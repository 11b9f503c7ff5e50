"""Artifacts in chunks: an artifact (a file or a byte string) is named by the sha256 of its bytes and
travels as `chunk_size` pieces (1 MiB unless the broker's packet limit is smaller), announced by a chunk
manifest with every chunk's sha256, so a receiver checks each piece as it lands and re-asks only for the
bad or missing ones. Chunk manifests are the transport's own; `edgefl.manifest` describes what an
exported artifact folder holds."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from edgefl.errors import ArtifactError
from edgefl.topics import is_sha256

CHUNK_SIZE = 1 << 20
WINDOW = 8               # chunks in flight per transfer, acknowledged one by one by the device
SCHEMA = "edgefl.chunks/1"


@dataclass(frozen=True)
class ChunkManifest:
    id: str                      # sha256 of the artifact's bytes
    size: int
    chunk_size: int
    chunks: tuple[str, ...]      # sha256 of each chunk

    @property
    def count(self) -> int:
        return len(self.chunks)

    def bounds(self, seq: int) -> tuple[int, int]:
        start = seq * self.chunk_size
        return start, min(start + self.chunk_size, self.size)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "id": self.id, "size": self.size, "chunk_size": self.chunk_size,
                "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, d: dict, expected_id: str) -> "ChunkManifest":
        try:
            m = cls(str(d["id"]), int(d["size"]), int(d["chunk_size"]), tuple(str(c) for c in d["chunks"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"artifact {expected_id[:12]}: malformed chunk manifest ({exc})") from None
        ok = (d.get("schema") == SCHEMA and m.id == expected_id and m.size >= 0 and m.chunk_size > 0
              and m.count == -(-m.size // m.chunk_size) and all(is_sha256(c) for c in m.chunks))
        if not ok:
            raise ArtifactError(f"artifact {expected_id[:12]}: the chunk manifest does not describe it "
                                f"(schema {d.get('schema')!r}, id {str(d.get('id'))[:12]}, {m.count} chunks "
                                f"for {m.size} bytes of {m.chunk_size})")
        return m


Data = Union[bytes, Path]


def read_range(data: Data, start: int, end: int) -> bytes:
    if isinstance(data, Path):
        with open(data, "rb") as f:
            return os.pread(f.fileno(), end - start, start)
    return bytes(memoryview(data)[start:end])


def describe(data: Data, chunk_size: int = CHUNK_SIZE) -> ChunkManifest:
    """The chunk manifest of a file or byte string (one pass over its bytes)."""
    whole, chunks, size = hashlib.sha256(), [], 0
    if isinstance(data, Path):
        with open(data, "rb") as f:
            while block := f.read(chunk_size):
                whole.update(block)
                chunks.append(hashlib.sha256(block).hexdigest())
                size += len(block)
    else:
        view = memoryview(data)
        for start in range(0, len(view), chunk_size):
            block = view[start:start + chunk_size]
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
        size = len(view)
    return ChunkManifest(whole.hexdigest(), size, chunk_size, tuple(chunks))
