"""``workflow_executor`` held at a gate: imported and set up, it starts on the benchmark's go.

    python -m benchmarks.gated_executor <workflow_executor's arguments>

Prints ``ready`` once Django is set up and the executor's modules are imported
(0.52 of the 0.61 s of CPU a 1x4 executor spent starting, finding an empty
queue and stopping, on the peers' machine on 7 December 2026), then
waits for a line on standard input and runs ``manage.py workflow_executor``
with the arguments given, exactly as ``python -m django workflow_executor``
would. Its standard output goes to standard error after ``ready``.

Why: a drain by two processes started together measured the second one's
start-up too. The first process to finish importing began draining on both
cores and the other imported on what was left, so the other's first start came
up to 0.87 s after the first's (0.01 to 0.87 s in eleven scratch 2x4 drains of
2.3 to 6.9 s on 7 December 2026): the 2x4 rate paid for a process start that the 1x1 and 1x4
drains (one process, started before its first claim) never see in their span.
The peers benchmark starts every drain's processes through this gate and lets
them all go together (:meth:`benchmarks.peers.Ours.executors`).
"""

from __future__ import annotations

import os
import sys

READY = "ready"


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    # the command's module imports the executor (daemon, engine, store): before the gate
    import vertique_workflow.management.commands.workflow_executor  # noqa: F401

    print(READY, flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if not sys.stdin.readline():
        raise SystemExit("no go: standard input closed before the start")
    execute_from_command_line(["gated_executor", "workflow_executor", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
