"""Lines torchrpc writes on this process's stderr (through ``sys.stderr``, so
code that captures it sees them), at most 10 in 10 s per site, as the native
core's logging (csrc/common/logging) limits its own."""

import collections
import sys
import threading
import time

_LINES, _SECONDS = 10, 10.0
_lock = threading.Lock()
_recent = collections.defaultdict(lambda: collections.deque(maxlen=_LINES))  # site -> last times


def warn_limited(site, text):
    """Writes 'torchrpc: text' unless `site` wrote _LINES lines in the last _SECONDS."""
    now = time.monotonic()
    with _lock:
        times = _recent[site]
        if len(times) == _LINES and now - times[0] < _SECONDS:
            return
        times.append(now)
    print(f"torchrpc: {text}", file=sys.stderr)
