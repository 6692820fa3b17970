"""Measurements in a fresh child process: results, errors and deaths come back as they should."""

import os

import pytest

from profilers import isolate
from profilers.errors import BenchError, SpecError
from profilers.specs import parse_input_spec


def test_runs_in_another_process_and_returns_the_result():
    assert isolate.run(os.getpid) != os.getpid()
    assert isolate.run(divmod, 17, 5) == (3, 2)
    first, second = isolate.run(os.getpid), isolate.run(os.getpid)
    assert first != second  # a fresh child each time, not a reused worker


def test_a_domain_error_in_the_child_is_raised_as_the_same_error():
    with pytest.raises(SpecError) as err:
        isolate.run(parse_input_spec, "3xbanana")
    with pytest.raises(SpecError) as same:
        parse_input_spec("3xbanana")
    assert str(err.value) == str(same.value)


def test_other_errors_and_dead_children_are_bench_errors():
    with pytest.raises(BenchError, match="ZeroDivisionError"):
        isolate.run(divmod, 1, 0)
    with pytest.raises(BenchError, match="died .*exit code 3"):
        isolate.run(os._exit, 3)
    assert isolate.run(divmod, 9, 2) == (4, 1)  # and the next measurement still works


def test_nothing_the_child_prints_reaches_stdout(capfd):
    isolate.run(print, "printed by the model")
    assert "printed by the model" not in capfd.readouterr().out


def test_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(isolate.ENV, "0")
    assert isolate.run(os.getpid) == os.getpid()


def test_a_result_that_cannot_be_pickled_is_an_error_not_a_death():
    with pytest.raises(BenchError, match="(?i)pickl"):
        isolate.run(_unpicklable)


def _unpicklable():
    return lambda: None
