"""`python -m kernels.cpu`: build the CPU kernels now (make setup does, so the first request never waits)."""

import sys
import time

from kernels.cpu import available

started = time.monotonic()
reason = available()
if reason:
    print(f"CPU kernels not available: {reason}; the engine uses its torch path")
    sys.exit(0)
print(f"CPU kernels ready ({time.monotonic() - started:.1f} s)")
