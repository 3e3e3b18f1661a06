"""`zoo.progress.Progress`: tqdm's bar on a terminal, tqdm-style lines in a log, silence for a
short stage or when disabled."""

from __future__ import annotations

import io
import re

from zoo.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_interval_and_a_last_one():
    log = io.StringIO()
    with Progress(total=4, description="zoo eval", unit="batches", log_every=0.0,
                  stream=log) as progress:  # fmt: skip
        progress.advance()
        progress.show(loss="0.69")
        progress.advance(3)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2  # one per advance (every 0 s), none again at the end
    assert re.fullmatch(r"zoo eval:  25%\| 1/4 batches \[\d\d:\d\d<\d\d:\d\d, .+batches/s\]",
                        lines[0]), lines[0]  # fmt: skip
    assert lines[1].startswith("zoo eval: 100%| 4/4 batches [") and lines[1].endswith(
        "batches/s, loss=0.69]"
    )


def test_a_short_stage_and_a_disabled_one_write_nothing():
    for enabled in (True, False):
        log = io.StringIO()
        with Progress(total=3, description="eval", enabled=enabled, stream=log) as progress:
            progress.advance(3)  # well within the default half minute
        assert log.getvalue() == ""


def test_a_terminal_gets_tqdms_bar():
    terminal = Terminal()
    with Progress(total=2, description="train", unit="step", stream=terminal) as progress:
        progress.advance(2)
    assert "train: 100%" in terminal.getvalue() and "2/2" in terminal.getvalue()
