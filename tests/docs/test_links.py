#!/usr/bin/env python3
"""The documentation's links (docs/README.md indexes the pages): every
relative link in README.md and docs/*.md must name a file or folder that
exists, and a link with an anchor must name a heading of its target page;
README.md stays a front door of at most 250 lines. Usage:
test_links.py [ROOT]; exit 0 when all hold, 1 naming each fault."""
import os
import re
import sys

MAX_README_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """The lines outside fenced code blocks, with their numbers."""
    inside = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, re.sub(r"`[^`]*`", "", line)  # inline code is no link


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for n, line in prose_lines(f.read()):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
                out.add(slug.replace(" ", "-"))
    return out


def check_file(root, rel):
    faults = []
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                faults.append(f"{rel}:{n}: dead link '{target}': {os.path.relpath(dest, root)} does not exist")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                faults.append(f"{rel}:{n}: link '{target}': no heading '#{anchor}' in {os.path.relpath(dest, root)}")
    return faults


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    pages = ["README.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    faults = []
    for rel in pages:
        faults += check_file(root, rel)
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        lines = f.read().count("\n")
    if lines > MAX_README_LINES:
        faults.append(f"README.md: {lines} lines, over the front door's {MAX_README_LINES}")
    for fault in faults:
        print(fault)
    print(f"{len(pages)} pages checked, {len(faults)} fault(s)")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
