"""The device's artifact cache, addressed by sha256: `<dir>/<sha>` is a complete file whose bytes hash
to its name (checked again every time it is used); `<dir>/partial/<sha>` is one being fetched, with
`<sha>.manifest` (its chunk manifest) and `<sha>.held` (one line per chunk written), so a fetch cut off by
a crash or a lost connection resumes with the chunks it already has; `<dir>/artifacts/<id>/` is an artifact
set as a trainer opens it (hard links into the cache).

The cache is bounded: `trim(keep)` (after each round) removes the other sets' folders, partial fetches not
touched for `partial_ttl_s`, and then the files used least recently until what is left beside the set just
trained fits `budget_bytes` (a set's frozen prefix, the same every round, is the file worth keeping)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Optional

from edgefl.errors import ArtifactError
from edgefl.manifest import sha256_file
from edgefl.protocol.chunks import ChunkManifest
from edgefl.topics import is_sha256


BUDGET_BYTES = 128 * 2**20       # what the cache may hold beyond the current round's set, by default
PARTIAL_TTL_S = 3600.0           # a partial fetch not touched this long is given up


class ArtifactCache:
    def __init__(self, folder: str | Path, budget_bytes: Optional[int] = None, partial_ttl_s: float = PARTIAL_TTL_S):
        self.folder = Path(folder)
        self.budget_bytes = BUDGET_BYTES if budget_bytes is None else budget_bytes
        self.partial_ttl_s = partial_ttl_s
        (self.folder / "partial").mkdir(parents=True, exist_ok=True)

    def path(self, artifact: str) -> Path:
        if not is_sha256(artifact):
            raise ArtifactError(f"{artifact!r} is not an artifact id (a sha256 in hex)")
        return self.folder / artifact

    def get(self, artifact: str) -> Optional[Path]:
        """The verified file, or None (a file that no longer matches its hash is removed)."""
        path = self.path(artifact)
        if not path.is_file():
            return None
        if sha256_file(path) != artifact:
            path.unlink()
            return None
        os.utime(path)            # its last use, for trim
        return path

    def put(self, data: bytes) -> Path:
        artifact = hashlib.sha256(data).hexdigest()
        tmp = self.folder / "partial" / f"{artifact}.put"
        tmp.write_bytes(data)
        os.replace(tmp, self.path(artifact))
        return self.path(artifact)

    def partial(self, artifact: str) -> "PartialArtifact":
        return PartialArtifact(self, self.path(artifact).name)

    def size(self) -> int:
        """Bytes the cache holds on disk (a file linked from a set's folder counted once)."""
        seen: dict[tuple[int, int], int] = {}
        for path in self.folder.rglob("*"):
            if path.is_file():
                st = path.stat()
                seen[(st.st_dev, st.st_ino)] = st.st_size
        return sum(seen.values())

    def trim(self, keep: Optional[Path] = None) -> int:
        """Cut the cache to its budget, keeping the set folder `keep` and the files it links; its size after."""
        kept: set[tuple[int, int]] = set()
        if keep is not None:
            kept = {(st.st_dev, st.st_ino) for p in Path(keep).rglob("*") if p.is_file() for st in [p.stat()]}
        sets = self.folder / "artifacts"
        for folder in (sets.iterdir() if sets.is_dir() else ()):
            if keep is None or folder.resolve() != Path(keep).resolve():
                shutil.rmtree(folder, ignore_errors=True)
        now = time.time()
        for path in (self.folder / "partial").iterdir():
            if now - path.stat().st_mtime > self.partial_ttl_s:
                path.unlink(missing_ok=True)
        files = [(p.stat(), p) for p in self.folder.iterdir() if p.is_file()]
        free = sorted((st.st_mtime, st.st_size, p) for st, p in files if (st.st_dev, st.st_ino) not in kept)
        held = sum(size for _, size, _ in free)
        for _, size, path in free:            # least recently used first
            if held <= self.budget_bytes:
                break
            path.unlink(missing_ok=True)
            held -= size
        return self.size()


class PartialArtifact:
    """Chunks land in place (pwrite at seq * chunk_size); each is checked against the chunk manifest
    first. The whole-file hash runs along while chunks arrive in order, so a clean fetch reads nothing back."""

    def __init__(self, cache: ArtifactCache, artifact: str):
        self.cache, self.id = cache, artifact
        base = cache.folder / "partial" / artifact
        self.data_path, self._manifest_path, self._held_path = base, Path(f"{base}.manifest"), Path(f"{base}.held")
        self.manifest: Optional[ChunkManifest] = None
        self.held: set[int] = set()
        self._hash, self._hashed = hashlib.sha256(), 0      # running hash over chunks [0, _hashed)
        if self._manifest_path.is_file():
            try:
                self.manifest = ChunkManifest.from_json(json.loads(self._manifest_path.read_text()), artifact)
                lines = self._held_path.read_text().split("\n") if self._held_path.exists() else []
                self.held = {int(s) for s in lines[:-1] if s.isdigit()} & set(range(self.manifest.count))
            except (ArtifactError, ValueError):
                self.discard()

    def start(self, manifest: ChunkManifest) -> None:
        self.manifest, self.held = manifest, set()
        self._hash, self._hashed = hashlib.sha256(), 0
        with open(self.data_path, "wb") as f:
            f.truncate(manifest.size)
        self._held_path.write_text("")
        self._manifest_path.write_text(json.dumps(manifest.to_json()))

    def missing(self) -> list[int]:
        return [s for s in range(self.manifest.count) if s not in self.held]

    @property
    def complete(self) -> bool:
        return self.manifest is not None and len(self.held) == self.manifest.count

    def accept(self, seq: int, data: bytes) -> str:
        """'ok' (written), 'dup' (already held: ignored) or 'bad' (does not match its sha256)."""
        if seq in self.held:
            return "dup"
        if not 0 <= seq < self.manifest.count or hashlib.sha256(data).hexdigest() != self.manifest.chunks[seq]:
            return "bad"
        fd = os.open(self.data_path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, seq * self.manifest.chunk_size)
        finally:
            os.close(fd)
        with open(self._held_path, "a") as f:
            f.write(f"{seq}\n")
        self.held.add(seq)
        if seq == self._hashed:
            self._hash.update(data)
            self._hashed += 1
        return "ok"

    def finish(self) -> Optional[Path]:
        """Move the complete, verified file into the cache. If the whole does not hash to the id (a chunk
        changed on disk), the chunks that no longer match are dropped and None is returned: fetch them again."""
        whole = self._hash.hexdigest() if self._hashed == self.manifest.count else sha256_file(self.data_path)
        if whole == self.id:
            os.replace(self.data_path, self.cache.path(self.id))
            self.discard()
            return self.cache.path(self.id)
        with open(self.data_path, "rb") as f:
            for seq in sorted(self.held):
                start, end = self.manifest.bounds(seq)
                if hashlib.sha256(os.pread(f.fileno(), end - start, start)).hexdigest() != self.manifest.chunks[seq]:
                    self.held.discard(seq)
        if self.complete:  # every chunk checks out yet the whole does not: the manifest itself is wrong
            self.discard()
            raise ArtifactError(f"artifact {self.id[:12]}: its chunks match the chunk manifest but the whole does "
                                "not hash to its id; the coordinator sent a wrong manifest")
        self._held_path.write_text("".join(f"{s}\n" for s in sorted(self.held)))
        self._hash, self._hashed = hashlib.sha256(), 0
        return None

    def discard(self) -> None:
        for p in (self.data_path, self._manifest_path, self._held_path):
            p.unlink(missing_ok=True)
        self.manifest, self.held = None, set()
