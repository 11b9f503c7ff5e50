"""The report's HTML: one self-contained page (inline style, no script) around the PNG figures.

The layout is fluid: every figure takes the full width of the page, whatever the window, and wide tables
scroll inside their own box, so the page itself never scrolls sideways. A table of contents (`contents`) links
every section and figure that has an id.
"""
from __future__ import annotations

import html
import re
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
nav ul { margin: 4px 0; padding-left: 20px; }
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
    """A figure whose id is its file's stem (the table of contents links it)."""
    anchor = html.escape(src.rsplit(".", 1)[0])
    return (f'<figure id="{anchor}"><img class="plot" src="{html.escape(src)}" alt="{html.escape(title)}">'
            f"<figcaption><b>{html.escape(title)}.</b> {html.escape(caption)}</figcaption></figure>")


_TARGET = re.compile(r'<h([23]) id="([^"]+)">(.*?)</h\1>|<figure id="([^"]+)">.*?<b>(.*?)\.</b>', re.S)


def contents(blocks: Iterable[str]) -> str:
    """A table of contents of `blocks`: each second-level heading with an id, and under it the headings and figures
    with ids that follow it (their text is already escaped)."""
    sections: list[tuple[str, str, list[str]]] = []
    for block in blocks:
        for m in _TARGET.finditer(block):
            level, anchor, text = (m[1], m[2], m[3]) if m[1] else ("3", m[4], m[5])
            link = f'<a href="#{anchor}">{text}</a>'
            if level == "2" or not sections:
                sections.append((anchor, link, []))
            else:
                sections[-1][2].append(f"<li>{link}</li>")
    items = "".join(f"<li>{link}" + (f"<ul>{''.join(subs)}</ul>" if subs else "") + "</li>" for _, link, subs in sections)
    return f'<nav id="contents"><b>Contents</b><ul>{items}</ul></nav>'



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
