"""scripts.matrix.schedule: the deadline, the priorities and the job queue."""

from __future__ import annotations

import datetime
import threading

from scripts import matrix
from scripts.matrix import schedule


def test_parse_deadline() -> None:
    now = datetime.datetime(2026, 1, 1, 5, 0, tzinfo=datetime.timezone.utc)
    assert schedule.parse_deadline("05:55", now) == now.replace(minute=55)
    assert schedule.parse_deadline("04:00", now) == now.replace(hour=4) + datetime.timedelta(days=1)
    assert schedule.parse_deadline("+60", now) == now + datetime.timedelta(seconds=60)
    assert schedule.parse_deadline(None, now) is None


def test_job_queue_runs_the_best_waiting_job_first() -> None:
    order: list[str] = []
    gate = threading.Event()
    queue = schedule.JobQueue(1)
    queue.submit((5,), gate.wait)  # occupies the only worker while the rest is queued
    queue.submit((2,), order.append, "late cell")
    queue.submit((1, 0), order.append, "3.12 cell")
    queue.submit(schedule.NEGATIVE_PRIORITY, order.append, "negative")
    gate.set()
    queue.wait()
    assert order == ["negative", "3.12 cell", "late cell"]


def test_every_row_gets_one_python_before_any_row_gets_a_second() -> None:
    rows = matrix.load_rows()
    keys = sorted((schedule.cell_priority(p, r), r.torch, p) for r in rows for p in r.pythons)
    firsts = [(t, p) for _, t, p in keys[: len(rows)]]
    # The newest Python each row has leads: 3.14, else (torch 2.8) 3.12.
    assert firsts == [("2.8.0", "3.12")] + [(r.torch, "3.14") for r in rows[1:]]
    assert [(t, p) for _, t, p in keys[len(rows) : len(rows) + 2]] == [
        ("2.8.0", "3.10"),
        ("2.9.1", "3.12"),
    ]
