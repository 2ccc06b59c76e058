"""MkDocs hook: Sphinx roles in docstrings (``:exc:`coord.LockLost```) as links.

coord's docstrings use reST fields and roles (anyio's style). mkdocstrings reads the
fields (``docstring_style: sphinx``) but leaves the roles as text, rendered as
``:exc:<code>coord.LockLost</code>``. This turns each into an optional cross-reference:
a link where the name is documented in the reference, plain code elsewhere. It also
drops the second colon of a reST literal block's ``::`` ("Example::").
"""

from __future__ import annotations

import re
from typing import Any

_ROLES = "class|exc|meth|func|attr|mod|data|obj"
_ROLE = re.compile(rf":(?:py:)?(?:{_ROLES}):<code>([~.]?)([^<]+)</code>")
_LITERAL = re.compile(r"::</p>(\s*<div class=\"highlight\">)")


def _link(match: re.Match[str]) -> str:
    prefix, target = match[1], match[2]
    title = target.rsplit(".", 1)[-1] if prefix == "~" else target
    return f'<autoref identifier="{target}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, **kwargs: Any) -> str:
    return _LITERAL.sub(r":</p>\1", _ROLE.sub(_link, html))
