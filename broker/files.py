"""Writing the deployment's files: atomically (a broker reloading mid-write never reads half a file),
private ones with mode 0600 from the first byte, and telling the caller whether anything changed.
The broker must run as the files' owner: the private ones are readable by nobody else. A deployment
written inside a git work tree that does not ignore it is one `git add .` from publishing its keys:
`unignored_in_git` says so."""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional


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


def unignored_in_git(folder: Path, secret: Path) -> Optional[str]:
    """The git work tree holding `folder` when git would not ignore `secret` (a file in it) there; None when
    `folder` is in no work tree, git ignores it, or git is not installed."""
    git = shutil.which("git")
    if git is None:
        return None

    def ask(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([git, "-C", str(folder), *args], capture_output=True, text=True, timeout=30)

    top = ask("rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return None
    # exit 1: not ignored; 0: ignored; 128: git could not tell (then say nothing rather than guess)
    return top.stdout.strip() if ask("check-ignore", "-q", str(secret.resolve())).returncode == 1 else None
