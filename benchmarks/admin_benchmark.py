"""Admin benchmark: render an instance page whose history has 100,000 entries.

    python scripts/with_postgres.py -- python -m benchmarks.admin_benchmark [--entries N]

A throwaway database (migrated with the test settings, which install the
admin) gets one ``order`` instance run to its wait step, then ``--entries``
history rows appended in bulk. A superuser's test client then renders, a
few times each, the instance page (latest history page, diagram, commands),
the page at an early entry (``?at=3``: state replayed from the decision log,
diagram of then), a page in the middle of the timeline (``?from=N/2``), and
the history list filtered on the instance. It prints the median and maximum
time and the number of queries of each. Not a test: the numbers depend on
the machine; what must hold is that the query counts do not grow with the
history (tests/test_admin_bounds.py checks that) and the times stay flat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"

from benchmarks.executor_benchmark import bench_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--no-diagram", action="store_true", help="leave the diagram out (to see its share)"
    )
    args = parser.parse_args()
    with bench_database(statements=False):
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext, setup_test_environment
        from django.urls import reverse

        import vertique_workflow as wf
        from vertique_workflow.models import WorkflowHistory
        from vertique_workflow.testing import run_until_idle

        setup_test_environment()
        if args.no_diagram:
            from vertique_workflow.admin import instances

            instances.instance_svg = lambda *a, **k: (None, "left out")
        ref = wf.start("order", {"amount": 5}, idempotency_key="bench", business_key="B-1")
        run_until_idle()
        start = WorkflowHistory.objects.filter(workflow_id=ref.id).count()
        began = time.perf_counter()
        batch = 10_000
        for first in range(1, args.entries + 1, batch):
            WorkflowHistory.objects.bulk_create(
                WorkflowHistory(
                    workflow_id=ref.id,
                    sequence=start + n,
                    event_type="COMMAND_DEFERRED",
                    payload_json={"commandId": 1, "kind": "SIGNAL", "reason": f"bench {n}"},
                    actor_kind="SYSTEM",
                    actor_id="bench",
                )
                for n in range(first, min(first + batch, args.entries + 1))
            )
        print(f"history: {start + args.entries} entries ({time.perf_counter() - began:.1f} s)")
        user = User.objects.create_superuser("bench", password="x")
        client = Client()
        client.force_login(user)
        page = reverse("admin:vertique_workflow_workflowinstance_change", args=[ref.id])
        history = reverse("admin:vertique_workflow_workflowhistory_changelist")
        cases = {
            "instance page (latest entries)": (page, {}),
            "instance page at entry 3": (page, {"at": 3}),
            "instance page, middle of the timeline": (page, {"from": args.entries // 2}),
            "history list of the instance": (history, {"workflow_id__exact": str(ref.id)}),
            "instance list": (reverse("admin:vertique_workflow_workflowinstance_changelist"), {}),
        }
        for name, (address, params) in cases.items():
            client.get(address, params)  # warm
            times = []
            for _ in range(args.repeat):
                with CaptureQueriesContext(connection) as captured:
                    t0 = time.perf_counter()
                    response = client.get(address, params)
                    times.append(time.perf_counter() - t0)
                assert response.status_code == 200, (name, response.status_code)
            print(
                f"{name:42s} median {statistics.median(times) * 1000:8.1f} ms  "
                f"max {max(times) * 1000:8.1f} ms  {len(captured):3d} queries  "
                f"{len(response.content) / 1024:7.1f} kB"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
