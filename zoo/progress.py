"""Progress of a long stage, on a terminal and in a log file alike.

`Progress` draws a tqdm bar when stderr is a terminal. When stderr is a file or a pipe (a job's
log), where a bar would be a flood of carriage returns or nothing at all, it writes a line in
tqdm's words every `log_every` seconds, and a last one when the stage ends, if it wrote any:

    eval:  31%| 40/128 batches [00:19<00:41, 2.10batches/s]

so a long stage (training, `zoo eval`, a reference model's pass) shows in a log that it is
alive and how long it has left, while a short one stays silent.
"""

from __future__ import annotations

import io
import sys
import time
from typing import TextIO

LOG_EVERY_SECONDS = 30.0  # between the lines written to a log
# tqdm's meter without the bar: "eval:  31%| 40/128 batches [00:19<00:41, 2.10batches/s]"
LOG_FORMAT = "{l_bar} {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
UNKNOWN_TOTAL_FORMAT = "{desc}: {n_fmt} {unit} [{elapsed}, {rate_fmt}{postfix}]"


class Progress:
    """A stage's progress: a tqdm bar on a terminal, a line now and then in a log.

    Args:
        total: the units the stage has (None: not known).
        description: the stage's name, first on the bar or line ("train", "zoo eval").
        unit: what is counted ("step", "batches", "sentences").
        initial: units done before (a resumed run).
        enabled: False shows nothing (`--no-progress`, processes other than 0).
        log_every: seconds between the lines written to a log (default `LOG_EVERY_SECONDS`).
        stream: where to write (default: stderr, as it is when the progress starts).
    """

    def __init__(
        self,
        *,
        total: int | None,
        description: str,
        unit: str = "it",
        initial: int = 0,
        enabled: bool = True,
        log_every: float | None = None,
        stream: io.TextIOBase | TextIO | None = None,
    ):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.description, self.unit = total, description, unit
        self.done, self.initial = initial, initial
        self.log_every = LOG_EVERY_SECONDS if log_every is None else log_every
        self.values: dict[str, str] = {}
        self.bar = None
        self.logs = False
        self.started = self.last_line = time.monotonic()
        self.lines = 0  # lines written to the log
        self.written = initial  # the count the last line showed
        if not enabled:
            return
        if self.stream.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=description, unit=unit,
                            dynamic_ncols=True, file=self.stream)  # fmt: skip
        else:
            self.logs = True

    def advance(self, count: int = 1) -> None:
        """`count` more units done."""
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.logs and time.monotonic() - self.last_line >= self.log_every:
            self._write_line()

    def show(self, **values: str) -> None:
        """Values shown after the counts (`loss="2.31"`), until they are shown again."""
        self.values = values
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=False)

    def close(self) -> None:
        """End the bar; in a log, write the last line if the stage wrote any."""
        if self.bar is not None:
            self.bar.close()
        elif self.logs and self.lines and self.written != self.done:
            self._write_line()
        self.logs = False

    def line(self) -> str:
        """The progress as one tqdm-style line."""
        from tqdm import tqdm

        postfix = ", ".join(f"{name}={value}" for name, value in self.values.items())
        elapsed = time.monotonic() - self.started
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else None
        form = UNKNOWN_TOTAL_FORMAT if self.total is None else LOG_FORMAT
        return tqdm.format_meter(self.done, self.total, elapsed, prefix=self.description,
                                 unit=self.unit, rate=rate, postfix=postfix,
                                 bar_format=form, initial=self.initial)  # fmt: skip

    def _write_line(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.lines += 1
        self.written, self.last_line = self.done, time.monotonic()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()
