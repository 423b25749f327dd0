"""`python -m services.trainer` (or `lpx-trainer`): train jobs from the work queue until SIGTERM."""

from __future__ import annotations

import asyncio
import signal

from libs import eventloop
from libs.logs import setup_logging
from services.trainer.app import Trainer
from services.trainer.settings import TrainerSettings


async def serve(settings: TrainerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    trainer = Trainer(settings)
    await trainer.start()
    print(f"trainer {settings.trainer_id} ready", flush=True)
    await trainer.run_until(stop)


def main() -> None:
    settings = TrainerSettings.load()
    setup_logging("trainer", settings.log_level, settings.log_format)
    eventloop.run(serve(settings))


if __name__ == "__main__":
    main()
