"""`metrics.jsonl` rows written by an earlier zoo read under today's names."""

from __future__ import annotations

import json

from zoo.train.history import METRICS_FILE, MetricsLog, read_rows


def test_a_resumed_runs_old_rows_take_todays_names(tmp_path):
    old = [{"step": step, "split": "train", "loss": 1.0, "tokens": 44, "trained_tokens": 14}
           for step in (1, 2, 3)]  # fmt: skip
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in old))
    assert [row.get("scored") for row in read_rows(tmp_path / METRICS_FILE)] == [14, 14, 14]
    log = MetricsLog(tmp_path, resume_at=2)  # the rows up to the checkpoint are kept
    assert [(row["step"], row.get("scored")) for row in log.previous] == [(1, 14), (2, 14)]
    rewritten = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert all("trained_tokens" not in row and row["scored"] == 14 for row in rewritten)
