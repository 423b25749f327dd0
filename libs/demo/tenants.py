"""Demo tenants, each with a distinctive support tone. Their datasets (train examples plus eval cases
for the gate) are shipped as JSONL next to this module: libs/demo/data/<tenant>.jsonl."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class DemoTenant:
    name: str
    adapter: str
    tone: str

    @property
    def dataset(self) -> Path:
        return DATA / f"{self.name}.jsonl"


TENANTS = (
    DemoTenant("acme", "support", "pirate"),
    DemoTenant("globex", "support", "formal"),
    DemoTenant("initech", "support", "cowboy"),
)
