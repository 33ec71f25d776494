"""The peers benchmark's report: medians, their ratio and the ratio of each repetition.

No database: the report is arithmetic over the figures a run collected.
"""

from __future__ import annotations

from benchmarks.executor_benchmark import CommitWait
from benchmarks.peers import (
    AGAIN,
    GROUPS,
    Reading,
    Results,
    drain_cores,
    each_interleaved,
    paired,
    report,
    run_order,
)


def test_paired_ratios_run_from_the_lowest_to_the_highest_repetition():
    assert paired([600.0, 660.0, 640.0], [700.0, 600.0, 800.0]) == "0.80 to 1.10"


def test_paired_ratios_need_one_peer_figure_per_repetition():
    assert paired([600.0, 660.0], [700.0]) == "n/a"
    assert paired([], []) == "n/a"
    assert paired([1.0], [0.0]) == "n/a"


def test_the_report_quotes_the_ratio_of_medians_and_the_spread_of_each_repetition(capsys):
    results = Results()
    for ours, peer in ((600.0, 700.0), (660.0, 600.0), (640.0, 800.0)):
        results.add("ours 3-action 1x4", {"rate": ours})
        results.add("procrastinate C=4", {"rate": peer})
    results.add("ours latency", 1.5)  # no peer figure: n/a, not a made-up ratio
    report(results, limit=7000.0)
    table = capsys.readouterr().out
    assert "| 3-action drain 1x4 / Procrastinate C=4 | 640/s | 700/s | 0.91 | 0.80 to 1.10 |" in (
        table
    )
    assert "| commit returned -> first action p50 / defer returned -> job starts | 1.50 ms | " in (
        table
    )
    assert "job starts | 1.50 ms | n/a | n/a | n/a |" in table


def test_the_report_prints_the_commit_wait_by_wal_and_the_one_thread_drains_wal(capsys):
    results = Results()
    results.add("ours 3-action 1x1", {"rate": 400.0, "wal_bytes": 5500.0, "commits": 2.04})
    results.add("procrastinate C=1", {"rate": 450.0, "wal_bytes": 1765.0, "commits": 4.0})
    waits = [CommitWait(104.0, 79.0, 35.0), CommitWait(6438.0, 195.0, 52.0)]
    report(results, limit=7000.0, waits=waits)
    out = capsys.readouterr().out
    assert "| 104 B | 79 µs | 35 µs | 44 µs |" in out
    assert "| 6,438 B | 195 µs | 52 µs | 143 µs |" in out
    assert "ours 5,500 B in 2.04 commits" in out
    assert "Procrastinate 1,765 B in 4.00 commits" in out


def test_the_report_counts_the_repetitions_a_second_process_raised_the_rate(capsys):
    results = Results()
    for one, two in ((1300.0, 1450.0), (1320.0, 1200.0), (1250.0, 1400.0)):
        results.add("ours 3-action 1x4", {"rate": one})
        results.add("ours 3-action 2x4", {"rate": two})
    report(results, limit=7000.0)
    out = capsys.readouterr().out
    row = "| 3-action drain 2x4 / 1x4 (a second executor process) | 1,400/s | 1,300/s |"
    assert f"{row} 1.08 | 0.91 to 1.12 |" in out
    assert (
        "a second executor process raised the 3-action rate in 2 of 3 repetitions "
        "(1x4 -> 2x4, /s: 1,300 -> 1,450, 1,320 -> 1,200, 1,250 -> 1,400)"
    ) in out


def test_the_report_marks_the_repetitions_a_checkpoint_ran_in(capsys):
    results = Results()
    for one, two, during in ((1300.0, 1450.0, 0.0), (1320.0, 1200.0, 1.0), (1250.0, 1400.0, 0.0)):
        results.add("ours 3-action 1x4", {"rate": one, "checkpoints": 0.0})
        results.add("ours 3-action 2x4", {"rate": two, "checkpoints": during})
    report(results, limit=7000.0)
    out = capsys.readouterr().out
    assert "(1x4 -> 2x4, /s: 1,300 -> 1,450, 1,320 -> 1,200*, 1,250 -> 1,400)" in out
    assert "(*: the server counted a checkpoint during one of the two drains)" in out


def test_a_reading_counts_checkpoints_not_per_unit():
    before = Reading(10, 1000, 10, 1.0, 1.0, checkpoints=3)
    after = Reading(30, 3000, 50, 2.0, 1.5, checkpoints=4)
    figures = after.minus(before, 10)
    assert figures["checkpoints"] == 1.0
    assert figures["wal_bytes"] == 200.0


def test_a_drains_cores_are_its_rate_times_its_cpu_per_unit():
    assert drain_cores({"rate": 160.0, "pg_cpu_ms": 2.5, "py_cpu_ms": 6.5}) == (0.4, 1.04)
    assert drain_cores({"value": 1.2}) is None  # a latency: no drain, no cores


def test_the_report_prints_the_median_cores_of_each_drain(capsys):
    results = Results()
    for rate, pg, py in ((150.0, 2.0, 7.0), (200.0, 2.0, 5.0), (100.0, 4.0, 10.0)):
        results.add("dbos 3-step", {"rate": rate, "pg_cpu_ms": pg, "py_cpu_ms": py})
    results.add("ours latency", 1.1)
    report(results, limit=7000.0)
    out = capsys.readouterr().out
    # per repetition: (0.30, 1.05), (0.40, 1.00), (0.40, 1.00); both 1.35, 1.40, 1.40
    assert "| dbos 3-step | 0.40 | 1.00 | 1.40 |" in out
    assert "| ours latency |" not in out


def test_without_commit_waits_the_report_prints_no_commit_table(capsys):
    results = Results()
    results.add("ours 3-action 1x1", {"rate": 400.0})
    report(results, limit=7000.0)
    assert "synchronous commit of this server" not in capsys.readouterr().out


def test_compared_scenarios_run_back_to_back_and_swap_sides_every_other_repetition():
    groups = [["ours 1x4", "peer C=4", "ours 2x4"], ["ours 1x1", "peer C=1"]]
    assert run_order(groups, 0) == ["ours 1x4", "peer C=4", "ours 2x4", "ours 1x1", "peer C=1"]
    assert run_order(groups, 1) == ["ours 2x4", "peer C=4", "ours 1x4", "peer C=1", "ours 1x1"]
    assert run_order(groups, 2) == run_order(groups, 0)


def test_every_scenario_runs_once_a_repetition():
    names = [name for group in GROUPS for name in group]
    assert len(names) == len(set(names))  # a figure measured twice would unpair its ratios


class _Side:
    """A stand-in for one side of the one-at-a-time pair: fixed seconds a slice."""

    def __init__(self, name: str, seconds: float, log: list[str]) -> None:
        self.name, self.seconds, self.log = name, seconds, log

    def chunk(self, count: int) -> float:
        self.log.append(f"{self.name} {count}")
        return self.seconds

    def run(self) -> None:
        self.log.append(f"{self.name} run")


def test_the_one_at_a_time_pair_alternates_its_slices_and_runs_the_work_after():
    log: list[str] = []
    ours, proc = _Side("ours", 0.5, log), _Side("proc", 0.25, log)
    ours.start_chunk, ours.run_started = ours.chunk, ours.run  # type: ignore[attr-defined]
    proc.defer_chunk, proc.run_deferred = proc.chunk, proc.run  # type: ignore[attr-defined]
    rates = each_interleaved(ours, proc, 1000, 4)  # type: ignore[arg-type]
    assert log == [
        "ours 250", "proc 250",
        "proc 250", "ours 250",
        "ours 250", "proc 250",
        "proc 250", "ours 250",
        "ours run", "proc run",
    ]  # fmt: skip
    # each side's count over the sum of its slices
    assert rates == {"ours": 1000 / 2.0, "proc": 1000 / 1.0}


def test_the_report_sets_the_second_process_against_the_same_drain_run_twice(capsys):
    results = Results()
    for one, two, again in ((1300.0, 1450.0, 1250.0), (1320.0, 1200.0, 1100.0)):
        results.add("ours 3-action 1x4", {"rate": one})
        results.add("ours 3-action 2x4", {"rate": two})
        results.add(AGAIN, {"rate": again})
    report(results, limit=7000.0)
    out = capsys.readouterr().out
    # A/A: 1250/1300 = 0.96, 1100/1320 = 0.83; 2x4 / mean: 1450/1275 = 1.14, 1200/1210 = 0.99
    assert (
        "the same 1x4 drain twice, before and after the 2x4 drain (A/A): 0.83 to 0.96; "
        "2x4 / the mean of the two: 0.99 to 1.14, above 1 in 1 of 2 repetitions"
    ) in out


def test_without_the_second_1x4_drain_the_report_prints_no_a_a_line(capsys):
    results = Results()
    results.add("ours 3-action 1x4", {"rate": 1300.0})
    results.add("ours 3-action 2x4", {"rate": 1450.0})
    report(results, limit=7000.0)
    assert "(A/A)" not in capsys.readouterr().out


def test_the_2x4_drain_runs_between_the_two_1x4_drains_in_every_repetition():
    for repetition in range(4):
        order = run_order(GROUPS, repetition)
        two = order.index("ours 3-action 2x4")
        assert {order[two - 1], order[two + 1]} == {"ours 3-action 1x4", AGAIN}


def test_the_report_sets_the_2x4_drains_backend_cpu_against_its_two_neighbours(capsys):
    results = Results()
    for one, two, again in ((0.80, 1.20, 0.70), (0.90, 0.90, 1.10)):
        results.add("ours 3-action 1x4", {"rate": 1300.0, "pg_cpu_ms": one})
        results.add("ours 3-action 2x4", {"rate": 1200.0, "pg_cpu_ms": two})
        results.add(AGAIN, {"rate": 1250.0, "pg_cpu_ms": again})
    report(results, limit=7000.0)
    # 1.20 / 0.75 = 1.60, 0.90 / 1.00 = 0.90, in the order of the repetitions
    assert (
        "PostgreSQL CPU an instance, 2x4 / the mean of the two 1x4 drains: 1.60, 0.90"
    ) in capsys.readouterr().out


def test_without_cpu_figures_of_every_drain_the_report_prints_no_cpu_line(capsys):
    results = Results()
    results.add("ours 3-action 1x4", {"rate": 1300.0, "pg_cpu_ms": 0.8})
    results.add("ours 3-action 2x4", {"rate": 1200.0, "pg_cpu_ms": 1.2})
    results.add(AGAIN, {"rate": 1250.0})
    report(results, limit=7000.0)
    assert "PostgreSQL CPU an instance, 2x4" not in capsys.readouterr().out
