"""The Markdown of docs/ as HTML, for the pages web/generate_pages.py writes.

It reads the subset the chapters are written in: headings (#, ##, ###), paragraphs, fenced code blocks, pipe
tables, lists (- and 1.), block quotes, and inline code, **bold**, *italic*, links, and math: $...$ inline and
$$...$$ on lines of their own (possibly over several lines), left as TeX in elements of class "math" for KaTeX to
lay out in the page (web/workbook.js). Headings get GitHub's anchors, so that links such as learn.md#3-attention
reach the same place. A construct it does not know is an error, not silently dropped: the chapters are the one
source of the pages, and a page that loses part of its chapter must not be written.
"""

import html
import re

# Links between the chapters that have pages: the Markdown file and the page it becomes.
PAGE_OF = {"reverse-mode.md": "reverse-mode.html", "learn.md": "learn.html"}


class MarkdownError(Exception):
    """A line of a chapter that the converter does not read."""


def slug(text):
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    plain = re.sub(r"[`*$\\]", "", text).lower()
    plain = re.sub(r"[^\w\- ]", "", plain)
    return plain.replace(" ", "-")


def link_target(url, source_url):
    """A link of a chapter as the page writes it: a chapter with a page goes to that page, any other file of docs/
    to its source in the repository (the pages lie in build-web/site/, two folders below the top)."""
    if re.match(r"^[a-z]+:", url) or url.startswith("#"):
        return url
    path, _, anchor = url.partition("#")
    if path in PAGE_OF:
        return PAGE_OF[path] + ("#" + anchor if anchor else "")
    return source_url + path + ("#" + anchor if anchor else "")


def split_outside_code(text, separator):
    """text cut at each separator that is outside `code` and $math$ (the cells of a table row)."""
    parts, current, in_code, in_math = [], [], False, False
    for ch in text:
        if ch == "`" and not in_math:
            in_code = not in_code
        elif ch == "$" and not in_code:
            in_math = not in_math
        if ch == separator and not in_code and not in_math:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def inline(text, source_url):
    """One line's inline Markdown as HTML: code spans and math first (their text is kept as written), then links,
    bold and italic in what remains."""
    out, pos = [], 0
    token = re.compile(r"(`+)(.+?)\1|\$([^$]+?)\$")
    for m in token.finditer(text):
        out.append(emphasis(text[pos:m.start()], source_url))
        if m.group(1):
            out.append("<code>" + html.escape(m.group(2).strip() if m.group(1) == "``" else m.group(2)) + "</code>")
        else:
            out.append('<span class="math">' + html.escape(m.group(3)) + "</span>")
        pos = m.end()
    out.append(emphasis(text[pos:], source_url))
    return "".join(out)


def emphasis(text, source_url):
    """Links, **bold** and *italic* of text with no code or math in it."""
    text = html.escape(text, quote=False)

    def link(m):
        target = html.escape(link_target(html.unescape(m.group(2)), source_url))
        return f'<a href="{target}">{m.group(1)}</a>'

    text = re.sub(r"!?\[([^\]]+)\]\(([^)\s]+)\)", link, text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", text)
    return text


def table(rows, source_url, where):
    """A pipe table: a header row, the |---| row, then the body."""
    cells = [split_outside_code(r.strip().strip("|"), "|") for r in rows]
    if len(cells) < 2 or not all(re.fullmatch(r"\s*:?-+:?\s*", c) for c in cells[1]):
        raise MarkdownError(f"{where}: a table needs a header row and a |---| row under it")
    head = "".join(f"<th>{inline(c.strip(), source_url)}</th>" for c in cells[0])
    body = "".join("<tr>" + "".join(f"<td>{inline(c.strip(), source_url)}</td>" for c in r) + "</tr>"
                   for r in cells[2:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def convert(text, name, source_url="../../docs/", after_block=None):
    """The chapter `text` (file `name`, for errors) as HTML, and its headings as (level, text, anchor).
    after_block(anchor, markdown), where given, is called with each block's Markdown and the anchor of the section it
    is in ("" before the first heading); the HTML it returns is put after the block's."""
    lines = text.split("\n")
    out, headings, i = [], [], 0
    section = ""
    while i < len(lines):
        line = lines[i]
        where = f"docs/{name}:{i + 1}"
        start, blocks = i, len(out)
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            language = line[3:].strip()
            end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if end == len(lines):
                raise MarkdownError(f"{where}: a code block that is not closed")
            code = "\n".join(lines[i + 1:end])
            cls = f' class="language-{html.escape(language)}"' if language else ""
            out.append(f"<pre><code{cls}>{html.escape(code)}</code></pre>")
            i = end + 1
        elif m := re.match(r"^(#{1,4}) (.+)$", line):
            level, title = len(m.group(1)), m.group(2).strip()
            anchor = slug(title)
            headings.append((level, title, anchor))
            out.append(f'<h{level} id="{anchor}">{inline(title, source_url)}</h{level}>')
            i += 1
        elif line.startswith("$$"):
            end = i
            while not lines[end].rstrip().endswith("$$") or (end == i and len(lines[end].strip()) < 4):
                end += 1
                if end == len(lines):
                    raise MarkdownError(f"{where}: a $$ display that is not closed")
            tex = "\n".join(lines[i:end + 1]).strip()[2:-2]
            out.append(f'<div class="math display">{html.escape(tex)}</div>')
            i = end + 1
        elif line.startswith("|"):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            out.append(table(lines[i:end], source_url, where))
            i = end
        elif re.match(r"^(\s*)([-*]|\d+\.) ", line):
            i = list_block(lines, i, out, source_url)
        elif line.startswith(">"):
            end = i
            while end < len(lines) and lines[end].startswith(">"):
                end += 1
            quoted = " ".join(q[1:].strip() for q in lines[i:end])
            out.append(f"<blockquote><p>{inline(quoted, source_url)}</p></blockquote>")
            i = end
        elif line.startswith("<") or line.startswith("    "):
            raise MarkdownError(f"{where}: raw HTML and indented code are not read; use a ``` block")
        else:
            end = i
            while end < len(lines) and paragraph_goes_on(lines[end]):
                end += 1
            out.append("<p>" + inline(" ".join(p.strip() for p in lines[i:end]), source_url) + "</p>")
            i = end
        if headings:
            section = headings[-1][2]
        if after_block and len(out) > blocks and (extra := after_block(section, "\n".join(lines[start:i]))):
            out.append(extra)
    return "\n".join(out), headings


def paragraph_goes_on(line):
    """Whether a line continues the paragraph above it: text, not the start of another block."""
    return bool(line.strip()) and not re.match(r"^(```|#{1,4} |\$\$|\||>|\s*([-*]|\d+\.) )", line)


def list_block(lines, i, out, source_url):
    """A list from line i (items that start with - or 1., continued by indented lines); returns the next line."""
    ordered = bool(re.match(r"^\s*\d+\. ", lines[i]))
    items = []
    while i < len(lines):
        m = re.match(r"^\s*(?:[-*]|\d+\.) (.*)$", lines[i])
        if m:
            items.append([m.group(1).strip()])
        elif lines[i].startswith("  ") and lines[i].strip() and items:
            items[-1].append(lines[i].strip())
        else:
            break
        i += 1
    tag = "ol" if ordered else "ul"
    out.append(f"<{tag}>" + "".join(f"<li>{inline(' '.join(item), source_url)}</li>" for item in items) + f"</{tag}>")
    return i
