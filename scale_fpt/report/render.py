"""The report's document model and its two renderings: blocks (heading, paragraph, bullets,
table, image) appended by the sections, written out as Markdown (``report.md``) and as one
self-contained HTML page (``report.html``, images embedded).

The Markdown is written here; the HTML is that Markdown rendered by markdown-it-py (raw HTML
off, so nothing in the text becomes markup it did not ask for) inside a jinja2 page with
autoescaping. Text that comes from a results folder (sweep names, ``git_sha``, errors,
labels) is data, never markup: table cells are escaped here, and the sections pass any row
text they put in a paragraph through ``escape_md``.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
from markdown_it import MarkdownIt
from markupsafe import Markup

from scale_fpt.confined import printable

MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")
"""CommonMark with GitHub's tables; raw HTML in the text is shown as text."""

PAGE = jinja2.Environment(autoescape=True).from_string(
    "<!doctype html><html><head><meta charset='utf-8'><title>{{ title }}</title>"
    "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
    "padding:3px 6px}img{max-width:100%}</style></head><body>\n{{ body }}</body></html>\n"
)

SPECIAL = re.compile(r"([\\`*_\[\]<>|!&#~])")


def escape_md(value) -> str:
    """``value`` as Markdown that renders as exactly its text on one line: line breaks,
    escape sequences and other control characters written visibly (``confined.printable``),
    every character with a meaning in Markdown (or HTML) backslash-escaped. For any text
    that comes from rows."""
    return SPECIAL.sub(r"\\\1", printable(str(value)))


@dataclass
class Document:
    """Blocks rendered to Markdown and HTML alike: (kind, payload). Headings, paragraphs and
    bullets are Markdown written by the sections; tables are data, escaped cell by cell."""

    root: Path
    title: str = "scale_fpt report"
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

    def markdown(self, *, embed_images: bool = False) -> str:
        """The document as Markdown; ``embed_images``: images as data URIs (for the HTML)."""
        out = []
        for kind, payload in self.blocks:
            if kind == "heading":
                out.append("#" * payload[0] + " " + printable(payload[1]))
            elif kind == "para":
                out.append(printable(payload))
            elif kind == "bullets":
                out.append("\n".join(f"- {printable(item)}" for item in payload))
            elif kind == "table":
                out.append(markdown_table(payload))
            elif kind == "image":
                out.append(self.image_markdown(*payload, embed=embed_images))
        return "\n\n".join(out) + "\n"

    def image_markdown(self, relative: str, caption: str, *, embed: bool) -> str:
        text = escape_md(caption)
        if embed:
            data = base64.b64encode((self.root / relative).read_bytes()).decode()
            return f"![{text}](data:image/png;base64,{data})\n\n*{text}*"
        csv = Path(relative).with_suffix(".csv")
        data = f" ([data]({csv}))" if (self.root / csv).exists() else ""
        return f"![{text}]({relative})\n\n*{text}*{data}"

    def html(self) -> str:
        body = Markup(MARKDOWN.render(self.markdown(embed_images=True)))
        return PAGE.render(title=self.title, body=body)


def inline_html(text: str) -> str:
    """One paragraph of Markdown as HTML, without the paragraph element."""
    return MARKDOWN.renderInline(text)


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
        return "| " + " | ".join(escape_md(c) for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)])
