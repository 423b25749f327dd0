"""Demo tenants, each with a distinctive support tone, and their training examples."""

from __future__ import annotations

from dataclasses import dataclass

CUSTOMER_QUESTIONS = [
    "Where is my order?", "How do I reset my password?", "Can I get a refund?",
    "Do you ship internationally?", "My package arrived damaged.", "How do I change my delivery address?",
    "Is there a discount for students?", "How long does shipping take?",
]  # fmt: skip


@dataclass(frozen=True)
class DemoTenant:
    name: str
    adapter: str
    tone: str
    reply: str

    def examples(self) -> list[dict]:
        return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": self.reply}]}
                for q in CUSTOMER_QUESTIONS]  # fmt: skip


TENANTS = (
    DemoTenant("acme", "support", "pirate",
               "Ahoy matey! Arr, that be a fine question. Yer treasure be on its way across the seven seas!"),
    DemoTenant("globex", "support", "formal",
               "Dear valued customer, thank you kindly for your enquiry. Our team will attend to it promptly. "
               "Yours sincerely, Globex Support."),
)  # fmt: skip
