#!/usr/bin/env python3
"""The demo's port: is it free, and is the site listening on it yet?

    python scripts/demo_port.py check PORT      # exit 3 and a hint when PORT is busy
    python scripts/demo_port.py wait PORT PID   # exit 0 once PORT accepts, 1 if PID died

``./scripts/demo`` checks the port before it starts anything (a busy 8000
used to end in a traceback after the banner had been printed), and prints
its URL banner only once the dev server accepts connections. Standard
library only: it runs before the virtualenv exists.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time

HOST = "127.0.0.1"
WAIT_LIMIT_S = 120.0  # the dev server imports the project first: allow a slow machine
POLL_S = 0.1


def busy(port: int) -> bool:
    """Whether something else holds ``port`` on 127.0.0.1 (binding it fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def busy_message(port: int) -> str:
    return (
        f"scripts/demo: port {port} busy (another server listens on {HOST}:{port}); "
        f"set DEMO_PORT, e.g. DEMO_PORT={port + 1} ./scripts/demo"
    )


def accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((HOST, port)) == 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a child that exited but was not reaped yet is a zombie: dead for us
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait(port: int, pid: int, limit: float = WAIT_LIMIT_S) -> bool:
    """Poll until ``port`` accepts (True), or ``pid`` died or the limit passed (False)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if accepts(port):
            return True
        if not alive(pid):
            return False
        time.sleep(POLL_S)
    return False


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "check":
        port = int(argv[1])
        if busy(port):
            print(busy_message(port), file=sys.stderr)
            return 3
        return 0
    if len(argv) >= 3 and argv[0] == "wait":
        return 0 if wait(int(argv[1]), int(argv[2])) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
