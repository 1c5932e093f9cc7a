"""The report's rows: one per implementation, registered when the recorder first meets it,
not at every example, and again after a pytest-xdist worker's ``take`` emptied it."""

from __future__ import annotations

from pytest_pallas import operations
from pytest_pallas.suite.implementation import bind_function, reference_implementation
from pytest_pallas.suite.report import ConformanceRecorder


def _mine(x, y):
    return x + y


def _counting(monkeypatch, recorder):
    registered = []
    register = recorder.register

    def counted(op, *args):
        registered.append(op)
        register(op, *args)

    monkeypatch.setattr(recorder, "register", counted)
    return registered


def test_an_implementation_is_registered_once_however_often_its_row_is_asked(monkeypatch):
    recorder = ConformanceRecorder()
    registered = _counting(monkeypatch, recorder)
    mine = bind_function(operations.add, _mine, "mine")
    assert [recorder.row(mine) for _ in range(5)] == ["add"] * 5
    assert registered == ["add"]
    assert recorder.ops["add"].implementation == "mine"


def test_a_second_implementation_of_an_op_gets_a_row_of_its_own():
    recorder = ConformanceRecorder()
    reference = reference_implementation(operations.add)
    mine = bind_function(operations.add, _mine, "mine")
    assert recorder.row(reference) == "add"
    assert recorder.row(mine) == "add (mine)"
    assert recorder.row(reference) == "add"
    assert list(recorder.ops) == ["add", "add (mine)"]
    assert recorder.ops["add"].implementation.startswith("reference (pytest_pallas.")


def test_a_row_is_registered_again_after_a_take_emptied_the_recorder(monkeypatch):
    recorder = ConformanceRecorder()
    registered = _counting(monkeypatch, recorder)
    mine = bind_function(operations.add, _mine, "mine")
    row = recorder.row(mine)
    recorder.example(row, "value")
    assert recorder.take()["add"]["properties"]["value"]["examples"] == 1
    assert recorder.ops == {}
    row = recorder.row(mine)  # the next test on the same worker
    recorder.example(row, "value")  # a KeyError if the row were not registered again
    assert registered == ["add", "add"]
