"""Output folders (`edgefl emulate -o`, `edgefl report -o`) are never overwritten silently.

A folder that already holds files is refused unless the user passes --force; then it is replaced whole, so
no file of the earlier output stays beside the new one. --force only ever deletes a folder that this kind
of command wrote (`ours`): a mistyped -o pointing at a home or source folder is refused, not emptied.

What a process must not share while it runs (a `fleet up`'s work folder, a device id at a broker) it holds with
`exclusive`: a lock file holding its pid, released when the process ends however it ends.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import IO, Callable

from edgefl.errors import ConfigError


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
