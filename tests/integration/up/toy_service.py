"""A stand-in service for the supervision tests: runs until SIGTERM, or crashes at start while the
file named by TOY_CRASH_FLAG exists."""

import os
import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    flag = os.environ.get("TOY_CRASH_FLAG")
    if flag and Path(flag).exists():
        print("toy: simulated crash at start-up (flag file present)", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("toy: up", flush=True)
    while True:
        time.sleep(1)
