"""calibrate.announced: a first run's long measurements are said on a terminal, and only there."""

from __future__ import annotations

import io

from llamaspec.calibrate import announced


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_measurement_is_announced_on_a_terminal_only(monkeypatch):
    calls = []
    measure = announced("the thing", lambda: calls.append(1) or 42)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert measure() == 42 and calls == [1]
    assert terminal.getvalue() == "llamaspec: measuring the thing on this machine (once; remembered)\n"
    pipe = io.StringIO()  # a log file, a test's captured stderr, a server's pipe
    monkeypatch.setattr("sys.stderr", pipe)
    assert measure() == 42 and calls == [1, 1] and pipe.getvalue() == ""
