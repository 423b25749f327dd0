"""`lpx demo`: the platform end to end on local defaults. It grows with every service that lands.

Today: bring the local stack up, fetch the base model, generate one answer through vLLM (AsyncLLM)
and print it, then say what was started and how to stop it.
"""

from __future__ import annotations

import asyncio
import time

import typer
from rich.console import Console
from rich.panel import Panel

console = Console()

DEFAULT_QUESTION = "What is the capital of France? Answer in one sentence."


def register(app: typer.Typer) -> None:
    app.command()(demo)


def demo(
    question: str = typer.Option(DEFAULT_QUESTION, help="what to ask the base model"),
    max_tokens: int = typer.Option(64, help="answer length in tokens"),
    base: str = typer.Option("smollm2-135m", help="base model from the catalogue"),
) -> None:
    """Run the platform end to end on local defaults and print a real model answer."""
    from libs.cli.stack import _print_status
    from libs.models.bootstrap import fetch
    from libs.stack import Stack, StackConfig

    stack = Stack(StackConfig())
    with console.status("1/3 starting the local stack (NATS JetStream, PostgreSQL, S3)..."):
        stack.up(on_event=lambda msg: console.log(msg))
    with console.status(f"2/3 fetching base model {base}..."):
        model = fetch(base)
    console.log(f"base model ready at {model.path}")
    with console.status("3/3 starting vLLM (AsyncLLM) and generating (~1 min on CPU)..."):
        answer, stats = asyncio.run(_generate(model.path, question, max_tokens))
    console.print(Panel(answer.strip(), title=f"{base} via vLLM: {question}", subtitle=stats))
    _print_status(stack)
    console.print("The stack keeps running for the next steps; stop it with [bold]make down[/bold] "
                  "(or `lpx stack down`).")  # fmt: skip


async def _generate(model_path, question: str, max_tokens: int) -> tuple[str, str]:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the demo shows our output, not vLLM's
    from libs.engine import EngineConfig, GenerationRequest, create_engine

    engine = create_engine(EngineConfig(model_path=model_path, enable_lora=False))
    started = time.monotonic()
    await engine.start()
    ready = time.monotonic()
    text, tokens = "", 0
    request = GenerationRequest("demo-1", messages=[{"role": "user", "content": question}], max_tokens=max_tokens)
    async for chunk in engine.generate(request):
        text += chunk.text
        tokens = chunk.completion_tokens
    elapsed = time.monotonic() - ready
    await engine.shutdown()
    stats = f"engine start {ready - started:.0f}s, {tokens} tokens in {elapsed:.1f}s ({tokens / elapsed:.0f} tok/s)"
    return text, stats
