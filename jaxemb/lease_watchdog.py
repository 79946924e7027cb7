"""The watchdog of a lease's holder (jaxemb/lease.py `_Watchdog`), run as a script with the standard library
alone: `python -I lease_watchdog.py PID SPAN GRACE MESSAGE`.

It reads deadlines (time.monotonic() values, one a line) from stdin, the newest after each renewal of the lease,
and SIGKILLs process PID once the newest has passed by GRACE seconds, then writes `error: MESSAGE` to stderr, its
`{age}` the seconds since that renewal (the deadline less SPAN). It ends when stdin closes: the holder released the
lease, or ended. A holder that runs fences itself at its deadline; this is for one that cannot (stopped by SIGSTOP,
or frozen), which would otherwise write into a run another process took over as soon as it ran again.
"""

import os
import select
import signal
import sys
import time


def watch(pid: int, span: float, grace: float, message: str):
  deadline, pending = None, b""
  while True:
    wait = None if deadline is None else max(deadline + grace - time.monotonic(), 0.0)
    if not select.select([sys.stdin.fileno()], [], [], wait)[0]:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:  # It ended on its own meanwhile.
        return
      age = time.monotonic() - (deadline - span)
      print("error: " + message.format(age=age), file=sys.stderr, flush=True)
      return
    chunk = os.read(sys.stdin.fileno(), 4096)
    if not chunk:
      return
    *lines, pending = (pending + chunk).split(b"\n")
    if lines:
      deadline = float(lines[-1])


if __name__ == "__main__":
  watch(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
