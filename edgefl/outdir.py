"""Output folders (`edgefl emulate -o`, `edgefl report -o`) are never overwritten silently.

A folder that already holds files is refused unless the user passes --force; then it is replaced whole, so
no file of the earlier output stays beside the new one. --force only ever deletes a folder that this kind
of command wrote (`ours`): a mistyped -o pointing at a home or source folder is refused, not emptied.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

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
