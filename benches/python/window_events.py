"""The events of the windowing benchmark, shared by every system it runs, and their oracle.

The workload: count events per user in tumbling one-minute windows on event time, with a
grace of 5 s for events out of order. `events(n)` is deterministic, so every system sees the
same stream and `digest` of their results can be compared across runs and systems.

- key `user-%05d`, `(i * 7919) % users`: 7919 is prime, so the users take turns;
- value about 50 bytes of JSON, one of 100;
- timestamp `start_ms + i * STEP_MS`, except every `LATE_EVERY`-th event, which is up to
  `LATE_MS_MAX` earlier (never before `start_ms`). An event is thus at most
  `LATE_MS_MAX + STEP_MS` behind the largest timestamp before it, well inside `GRACE_MS`:
  none is dropped as late, and the oracle counts every event.

Windows are `[start, start + WINDOW_MS)`, aligned to the epoch (as Chronik's
`Windows::tumbling`), so a window is named by its start in milliseconds since the epoch.
"""

import hashlib
from collections import Counter

WINDOW_MS = 60_000
GRACE_MS = 5_000
START_MS = 1_700_000_000_000
STEP_MS = 5
LATE_EVERY = 97
LATE_MS_MAX = 2_000
VALUES = tuple(b'{"page":"/p/%02d","action":"view","ref":"home/feed"}' % p for p in range(100))

# Nothing may be dropped: the latest an event can be is inside the grace.
assert LATE_MS_MAX + STEP_MS < GRACE_MS
assert all(len(v) == 50 for v in VALUES)


def timestamp_ms(i, start_ms=START_MS):
    """The event time of event `i`."""
    ts = start_ms + i * STEP_MS
    if i % LATE_EVERY == LATE_EVERY - 1:
        # Spread the delays over 1..LATE_MS_MAX ms; 389 is prime to LATE_MS_MAX.
        ts -= min((i // LATE_EVERY) * 389 % LATE_MS_MAX + 1, i * STEP_MS)
    return ts


def events(n, users=10_000, start_ms=START_MS):
    """Yield `n` events `(key: str, value: bytes, timestamp_ms: int)`, the same every time."""
    assert n >= 0 and users > 0
    for i in range(n):
        yield f"user-{(i * 7919) % users:05d}", VALUES[i % 100], timestamp_ms(i, start_ms)


def window_start_ms(ts):
    """The start of the window an event time falls in."""
    return ts - ts % WINDOW_MS


def expected(n, users=10_000, start_ms=START_MS):
    """The exact results, `[(key, window_start_ms, count)]` sorted, counted in plain Python."""
    counts = Counter((key, window_start_ms(ts)) for key, _, ts in events(n, users, start_ms))
    results = sorted((key, start, count) for (key, start), count in counts.items())
    assert sum(count for _, _, count in results) == n
    return results


def digest(results):
    """A hex sha256 of `(key, window_start_ms, count)` triples, independent of their order."""
    sha = hashlib.sha256()
    for key, start, count in sorted(results):
        sha.update(f"{key},{start},{count}\n".encode())
    return sha.hexdigest()
