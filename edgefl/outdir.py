"""Output folders (`edgefl emulate -o`, `edgefl report -o`) are never overwritten silently, and what a run
writes into them is written whole or not at all.

A folder that already holds files is refused unless the user passes --force; then it is replaced whole, so
no file of the earlier output stays beside the new one. --force only ever deletes a folder that this kind
of command wrote (`ours`): a mistyped -o pointing at a home or source folder is refused, not emptied.
`write_atomic` writes a file beside its place and renames it there: a reader (or a resumed run) sees the
old file or the new one, never half of one; on a full disk nothing is left behind and the error names the
folder and the space the file needed.

What a process must not share while it runs (a `fleet up`'s work folder, a device id at a broker) it holds with
`exclusive`: a lock file holding its pid, released when the process ends however it ends.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path
from typing import IO, Callable

from edgefl.errors import ConfigError, StorageError
from edgefl.units import format_bytes


def check_output(folder: Path, force: bool, what: str, ours: Callable[[Path], bool]) -> None:
    """Raise unless `folder` may be written: absent, empty, or (with force) an earlier `what` folder."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"-o {folder}: is a file, not a folder; choose another -o")
    if not folder.exists() or not any(folder.iterdir()):
        return
    if not force:
        raise ConfigError(f"-o {folder}: already holds a {what} ({_sample(folder)}); "
                          "choose another -o or pass --force to replace it")
    if not ours(folder):
        raise ConfigError(f"-o {folder}: holds files that are not an edgefl {what} ({_sample(folder)}); "
                          f"--force replaces only a {what} folder, so choose another -o")


def make_output(folder: Path, force: bool) -> None:
    """Create `folder`; with force, remove what an earlier output left first (check_output said it may)."""
    if force and folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)


def _sample(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def exclusive(path: Path, refusal: Callable[[str], str]) -> IO[str]:
    """A lock on `path` held until the returned file is closed (it is a context manager) or this process ends;
    ConfigError(refusal(the holder's pid)) when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise ConfigError(refusal(holder)) from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def write_atomic(path: Path, data: bytes | Callable[[Path], None], durable: bool = True) -> None:
    """`data` as the file `path`, whole or not at all (temp file + rename; `durable`: synced first, so a crash
    right after leaves the new file); `data` may be a function that writes the file it is given. StorageError,
    with the temp file removed, when it cannot be written."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        size = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        raise storage_error(path, exc, len(data) if isinstance(data, bytes) else size) from None
    except BaseException:      # Ctrl-C, or SIGTERM on serve, mid-write: no temporary file stays behind
        tmp.unlink(missing_ok=True)
        raise


def storage_error(path: Path, exc: OSError, needed: int = 0) -> StorageError:
    """The one-line error for a write that failed: a full disk names the folder, the space the write needed
    and what is free there."""
    folder = Path(path).parent
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            free = 0
        return StorageError(f"{folder}: no space left on the device for {Path(path).name} ({format_bytes(needed)} "
                            f"needed, {format_bytes(free)} free); free space there and run the same command again "
                            "(a served run resumes from its last checkpoint)")
    return StorageError(f"{path}: cannot write it ({exc.strerror or exc}); check the folder's permissions and space")
