"""The report's document model and its two renderings: blocks (heading, paragraph, bullets,
table, image) appended by the sections, written out as Markdown (``report.md``) and as one
self-contained HTML page (``report.html``, images embedded)."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from scale_fpt.confined import printable


@dataclass
class Document:
    """Blocks rendered to Markdown and HTML alike: (kind, payload)."""

    root: Path
    blocks: list = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("bullets", items))

    def table(self, frame: pd.DataFrame) -> None:
        self.blocks.append(("table", frame))

    def image(self, relative: str, caption: str) -> None:
        self.blocks.append(("image", (relative, caption)))

    def markdown(self) -> str:
        out = []
        for kind, payload in self.blocks:
            if kind == "heading":
                out.append("#" * payload[0] + " " + markdown_text(payload[1]))
            elif kind == "para":
                out.append(markdown_text(payload))
            elif kind == "bullets":
                out.append("\n".join(f"- {markdown_text(item)}" for item in payload))
            elif kind == "table":
                out.append(markdown_table(payload))
            elif kind == "image":
                relative, caption = payload
                csv = Path(relative).with_suffix(".csv")
                data = f" ([data]({csv}))" if (self.root / csv).exists() else ""
                caption = literal(caption)
                out.append(f"![{caption}]({relative})\n\n*{caption}*{data}")
        return "\n\n".join(out) + "\n"

    def html(self) -> str:
        out = [
            "<!doctype html><html><head><meta charset='utf-8'><title>scale_fpt report</title>",
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
            "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
            "padding:3px 6px}img{max-width:100%}</style></head><body>",
        ]
        for kind, payload in self.blocks:
            if kind == "heading":
                out.append(f"<h{payload[0]}>{html.escape(printable(payload[1]))}</h{payload[0]}>")
            elif kind == "para":
                out.append(f"<p>{inline_html(payload)}</p>")
            elif kind == "bullets":
                items = "".join(f"<li>{inline_html(i)}</li>" for i in payload)
                out.append(f"<ul>{items}</ul>")
            elif kind == "table":
                out.append(html_table(payload))
            elif kind == "image":
                relative, caption = payload
                data = base64.b64encode((self.root / relative).read_bytes()).decode()
                out.append(
                    f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(caption)}'>"
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
        return "\n".join(out) + "</body></html>\n"


LINK = re.compile(r"\[([^\]]+)\]\(([^)\s:]+)\)")
"""A Markdown link to a file of the report (a relative path: no scheme, so no
``javascript:`` or remote address becomes a link, whatever text reached a paragraph)."""


def markdown_text(text: str) -> str:
    """Text of a block as Markdown that stays one block: control characters (a newline,
    an escape sequence) written visibly, ``<`` as an entity (no raw HTML tag). The
    sections' own markup (links, **bold**, `code`) is kept; row text they interpolate
    goes through ``literal``."""
    return printable(text).replace("<", "&lt;")


def literal(value) -> str:
    """A value of a results folder (a git SHA, a sweep name, an error) as Markdown text that
    is shown as written: one line, and no link, image or emphasis of its own."""
    return re.sub(r"([\\`*_\[\]!])", r"\\\1", markdown_text(str(value)))


BOLD = re.compile(r"\*\*(.+?)\*\*")


CODE = re.compile(r"`([^`]+)`")


MARKDOWN_ESCAPE = re.compile(r"\\([\\`*_\[\]!])")


def inline_html(text: str) -> str:
    """A paragraph's Markdown links, **bold** and `code` as HTML, everything else escaped
    (``literal``'s Markdown escapes undone first: HTML escapes its own way)."""
    plain = html.unescape(MARKDOWN_ESCAPE.sub(r"\1", text))
    out = html.escape(printable(plain), quote=False)
    out = LINK.sub(lambda m: f'<a href="{html.escape(m[2])}">{m[1]}</a>', out)
    out = BOLD.sub(r"<strong>\1</strong>", out)
    return CODE.sub(r"<code>\1</code>", out)


def rows_of(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    show_index = frame.index.name is not None or not isinstance(frame.index, pd.RangeIndex)
    names = [str(n or "") for n in frame.index.names] if show_index else []
    header = names + [str(c) for c in frame.columns]
    body = []
    for index, row in zip(frame.index, frame.itertuples(index=False), strict=True):
        keys = (list(index) if isinstance(index, tuple) else [index]) if show_index else []
        body.append([display(v) for v in (*keys, *row)])
    return header, body


def display(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{value:.4g}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "*(empty)*"
    header, body = rows_of(frame)

    def line(cells):
        return (
            "| "
            + " | ".join(markdown_text(c).replace("|", "\\|").replace("](", "]\\(") for c in cells)
            + " |"
        )

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)])


def html_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p><em>(empty)</em></p>"
    header, body = rows_of(frame)
    head = "".join(f"<th>{html.escape(printable(h))}</th>" for h in header)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(printable(c))}</td>" for c in row) + "</tr>"
        for row in body
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
