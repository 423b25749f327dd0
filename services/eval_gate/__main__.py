"""`python -m services.eval_gate` (or `lpx-eval-gate`): evaluate new adapter versions until SIGTERM."""

from __future__ import annotations

import asyncio
import signal

from libs import eventloop
from libs.logs import setup_logging
from services.eval_gate.app import EvalGate
from services.eval_gate.settings import EvalGateSettings


async def serve(settings: EvalGateSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gate = EvalGate(settings)
    await gate.start()
    print(f"eval gate {settings.gate_id} ready (base {settings.base_model})", flush=True)
    try:
        await gate.run_until(stop)
    finally:
        await gate.close()


def main() -> None:
    settings = EvalGateSettings.load()
    setup_logging("eval-gate", settings.log_level, settings.log_format)
    eventloop.run(serve(settings))


if __name__ == "__main__":  # vLLM's engine core is a spawned process: keep this guard
    main()
