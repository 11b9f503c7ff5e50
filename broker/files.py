"""Writing the deployment's files: atomically (a broker reloading mid-write never reads half a file),
private ones with mode 0600 from the first byte, and telling the caller whether anything changed.
The broker must run as the files' owner: the private ones are readable by nobody else."""
from __future__ import annotations

import grp
import os
import pwd
import tempfile
from pathlib import Path


def write_file(path: Path, text: str, private: bool = False) -> bool:
    """Replace `path` with `text`; True when the content differs from what was there."""
    data = text.encode()
    try:
        same = path.read_bytes() == data
    except OSError:
        same = False
    mode = 0o600 if private else 0o644
    if same:
        path.chmod(mode)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")   # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def owner() -> tuple[str, str]:
    """The user and group that own what this process writes (numbers where the system has no name)."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    try:
        group = grp.getgrgid(os.getgid()).gr_name
    except KeyError:
        group = str(os.getgid())
    return user, group
