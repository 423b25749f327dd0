"""Run every benchmark in this folder (`bench_*.py`), one after another, side by side in one run.

Each benchmark prints its own table and writes JSON (and plots) under --out. This driver prints a
summary of which ran and how long each took, and exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where JSON and plots go")
    parser.add_argument("--only", nargs="*", default=None, help="benchmark names to run (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in args.only or s.stem in args.only]
    summary, failed = [], False
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, str(script), "--out", str(args.out)])
        summary.append((script.stem, code, time.monotonic() - started))
        failed |= code != 0
    print("\nbenchmark        status  wall")
    for name, code, wall in summary:
        print(f"{name:<16} {'ok' if code == 0 else f'FAIL({code})':<7} {wall:6.1f}s")
    print(f"results in {args.out.resolve()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
