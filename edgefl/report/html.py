"""The report's HTML: one self-contained page (inline style, no script) around the PNG figures.

The layout is fluid: every figure takes the full width of the page, whatever the window, and wide tables
scroll inside their own box, so the page itself never scrolls sideways.
"""
from __future__ import annotations

import html
from typing import Iterable, Sequence

STYLE = """
* { box-sizing: border-box; }
body { margin: 0; font-family: system-ui, sans-serif; line-height: 1.4; color: #222; }
main { max-width: 1800px; margin: 0 auto; padding: 0 16px 32px; }
h2 { margin-top: 40px; border-bottom: 1px solid #ccc; }
figure { margin: 0 0 28px; }
figure img { display: block; width: 100%; height: auto; }
figcaption { font-size: 0.9em; color: #555; margin-top: 4px; }
.scroll { max-width: 100%; overflow-x: auto; margin-bottom: 20px; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; overflow-wrap: break-word; }
th { background: #f4f4f4; }
p.note { color: #555; }
"""


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def records_table(rows: list[dict]) -> str:
    """A table of dicts that share their keys (the keys are the header)."""
    return table(list(rows[0]), [list(r.values()) for r in rows]) if rows else ""


def figure(src: str, title: str, caption: str) -> str:
    return (f'<figure><img class="plot" src="{html.escape(src)}" alt="{html.escape(title)}">'
            f"<figcaption><b>{html.escape(title)}.</b> {html.escape(caption)}</figcaption></figure>")


def heading(text: str, level: int = 2, anchor: str = "") -> str:
    attr = f' id="{html.escape(anchor)}"' if anchor else ""
    return f"<h{level}{attr}>{html.escape(text)}</h{level}>"


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def page(title: str, blocks: Iterable[str]) -> str:
    return ("<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
            + "\n".join(blocks) + "\n</main></body></html>\n")
