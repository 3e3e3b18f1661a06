import json

from zoo.cli import main


def test_presets_table_lists_flavor_and_count(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    gpt2 = next(line for line in out.splitlines() if line.startswith("gpt2 "))
    assert "gpt" in gpt2 and "124,439,808" in gpt2


def test_presets_json(capsys):
    assert main(["presets", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_name = {row["name"]: row for row in rows}
    assert by_name["bert-base"]["flavor"] == "classifier"
    assert by_name["translator-tiny"]["params"] == 237_824
    assert (by_name["llama-3.2-1b"]["params"], by_name["llama-3.2-1b"]["kv_heads"]) == (
        1_235_814_400,
        8,
    )
    assert by_name["qwen3-0.6b"]["params"] == 596_049_920


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "presets" in capsys.readouterr().out


def test_warnings_are_printed_as_one_line_of_the_command(monkeypatch, capsys):
    """A warning reads `zoo presets: warning: ...`, not Python's `file:line: UserWarning:` with
    the source line below it; Python's own printer is back after the command."""
    import warnings

    import zoo.cli.presets as presets_command
    from zoo.cli import main

    def rows_with_a_warning():
        warnings.warn("the preset table is stale", UserWarning, stacklevel=1)
        return []

    monkeypatch.setattr(presets_command, "rows", rows_with_a_warning)
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        main(["presets", "--json"])
    err = capsys.readouterr().err
    assert err == "zoo presets: warning: the preset table is stale\n"
    assert warnings.showwarning is before
