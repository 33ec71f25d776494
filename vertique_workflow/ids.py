"""Time-ordered row ids (instances, timers, tasks, branch tokens): UUID version 7 (RFC 9562).

An instance's id keys the instances' primary key and the ``workflow_id``
indexes of every table that holds its rows (history, commands, dedup,
timers, tasks). A random id (version 4) sends each new instance to a random
leaf page of each of those indexes, so a drain of a few thousand instances
changes thousands of leaf pages spread over the whole index. After a
checkpoint the first change of each page writes the whole page to the WAL
(8 kB, full-page writes), and an index larger than shared buffers reads one
for each. A version 7 id begins with the millisecond it was made: the
instances of the same minutes share the indexes' last pages. Measured in
docs/performance.md ("Time-ordered instance ids").

The 74 bits after the timestamp and the version and variant bits are random
(``os.urandom``), so two ids made in the same millisecond still differ; the
timestamp tells when the instance was started, which its ``created_at``
column says anyway. Python 3.14's ``uuid.uuid7`` is used where it exists.
"""

from __future__ import annotations

import os
import time
import uuid

_MS_BITS = (1 << 48) - 1
_RAND_A_BITS = (1 << 12) - 1
_RAND_B_BITS = (1 << 62) - 1


def uuid7() -> uuid.UUID:
    """A new UUID of version 7: 48 bits of Unix milliseconds, then 74 random bits."""
    native = getattr(uuid, "uuid7", None)
    if native is not None:
        return native()  # type: ignore[no-any-return]
    return compose(time.time_ns() // 1_000_000, os.urandom(10))


def compose(millis: int, random: bytes) -> uuid.UUID:
    """The version 7 UUID of ``millis`` (Unix milliseconds) and 74 of ``random``'s 80 bits.

    Separate from :func:`uuid7` so its layout is tested with chosen inputs.
    """
    bits = int.from_bytes(random, "big")
    value = (
        (millis & _MS_BITS) << 80
        | 0x7 << 76  # version 7
        | (bits >> 62 & _RAND_A_BITS) << 64
        | 0b10 << 62  # the RFC 4122 / 9562 variant
        | bits & _RAND_B_BITS
    )
    return uuid.UUID(int=value)
