import threading

from hwlat import output


def test_budget_progress_runs_no_refresh_thread_while_work_is_timed(monkeypatch):
    """The bar redraws from `update`, so nothing else competes for a core during timing."""
    before = threading.active_count()
    redraws = []
    with output.budget_progress("profiling") as update:
        inside = threading.active_count()
        import rich.progress

        monkeypatch.setattr(rich.progress.Progress, "refresh",
                            lambda self: redraws.append(1))
        for i in range(50):  # 50 back-to-back updates: one redraw, not 50
            update(f"timing {i}", i / 50)
    assert inside == before
    assert 1 <= len(redraws) <= 3  # the first update, maybe one more, the final state


def test_budget_progress_disabled_draws_nothing(capsys):
    with output.budget_progress("profiling", enabled=False) as update:
        update("timing x", 0.5)
    assert capsys.readouterr() == ("", "")
