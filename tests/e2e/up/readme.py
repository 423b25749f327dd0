"""The README's shell blocks, as a new user copies them: found by their section's heading."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def shell_block(heading: str, readme: Path = README) -> str:
    """The first ```bash block under `heading` (a line of the README, e.g. '### Try it with your own
    adapter'), before the next heading of any level."""
    text = readme.read_text()
    start = text.index(f"\n{heading}\n")
    section = re.split(r"\n#{1,6} ", text[start + len(heading) + 2 :], maxsplit=1)[0]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    if match is None:
        raise LookupError(f"no bash block under {heading!r} in {readme}")
    return match.group(1)
