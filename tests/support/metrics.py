"""Reading one sample out of a Prometheus text exposition, as the tests do."""

from __future__ import annotations

import re


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of sample ``name`` with exactly ``labels`` (as written between the braces, e.g.
    ``'outcome="cancelled"'``) in ``text``; 0.0 when absent (a counter not yet incremented)."""
    pattern = "^" + re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0
