"""Files `datasets` cannot read get an error naming the file, the line or byte, and the fix."""

from __future__ import annotations

import json

import pytest

from zoo.data import DataError, load_spec

ROWS = [{"text": "good fun", "label": 1}, {"text": "dull", "label": 0}]


def jsonl(folder, name, lines):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(line + "\n" for line in lines))
    return folder


def test_an_empty_file_is_named_with_its_split(tmp_path):
    # datasets raised a bare StopIteration
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(DataError, match=r"train.jsonl is empty \(0 bytes\), so the 'train' split"):
        load_spec(f"json:{tmp_path}")


def test_a_malformed_json_line_is_named_by_number(tmp_path):
    lines = [json.dumps(row) for row in ROWS] + ['{"text": "x", "label": 1', json.dumps(ROWS[0])]
    folder = jsonl(tmp_path / "d", "train.jsonl", lines)
    with pytest.raises(DataError, match=r"train.jsonl line 3 is not valid JSON \(Expecting ',' "
                       r"delimiter at column 25\).*fix or delete that line"):  # fmt: skip
        load_spec(f"json:{folder}", cache_dir=tmp_path / "c")
    folder = jsonl(tmp_path / "e", "train.jsonl", [json.dumps(ROWS[0]), "[1, 2]"])
    with pytest.raises(DataError, match="line 2 is a JSON list, not an object"):
        load_spec(f"json:{folder}", cache_dir=tmp_path / "c")


def test_text_that_is_not_utf8_names_the_byte_and_the_option(tmp_path):
    path = tmp_path / "poem.txt"
    path.write_bytes("first line\ncaf\u00e9 ol\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"poem.txt is not utf-8 text: byte 0xe9 at line 2, "
                       r"column 4 \(byte offset 14\).*--encoding NAME"):  # fmt: skip
        load_spec(f"text:{path}", cache_dir=tmp_path / "c")
    loaded = load_spec(f"text:{path}", cache_dir=tmp_path / "c", encoding="latin-1")
    assert loaded["train"]["text"] == ["first line\ncaf\u00e9 ol\u00e9\n"]


def test_json_in_another_encoding_loads_with_encoding(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(
        ('{"text": "d\u00e9j\u00e0 vu", "label": 1}\n').encode("latin-1")
    )
    with pytest.raises(DataError, match=r"byte 0xe9 at line 1, column 12"):
        load_spec(f"json:{tmp_path}", cache_dir=tmp_path / "c")
    loaded = load_spec(f"json:{tmp_path}", cache_dir=tmp_path / "c2", encoding="latin-1")
    assert loaded["train"]["text"] == ["d\u00e9j\u00e0 vu"]
    with pytest.raises(ValueError, match="unknown encoding 'latin-9000'; pass a Python codec"):
        load_spec(f"json:{tmp_path}", encoding="latin-9000")


def test_a_csv_with_a_header_only(tmp_path):
    # datasets said: Instruction "train" corresponds to no data!
    (tmp_path / "train.csv").write_text("text,label\n")
    with pytest.raises(DataError, match=r"train.csv has a header \(text, label\) but no rows"):
        load_spec(f"csv:{tmp_path}", cache_dir=tmp_path / "c")


def test_a_hub_name_offline_says_how_to_get_the_data(tmp_path, monkeypatch):
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match=r"hf:no_such_dataset_here: the dataset cannot be loaded "
                       r".*save_to_disk\(DIR\) and pass hf:DIR"):  # fmt: skip
        load_spec("hf:no_such_dataset_here", cache_dir=tmp_path / "c")


def test_a_validation_file_with_other_columns_names_both_files_and_the_columns(tmp_path):
    # datasets raised a multi-line Arrow CastError and zoo said "check that each file is json"
    jsonl(tmp_path, "train.jsonl", [json.dumps(row) for row in ROWS])
    jsonl(tmp_path, "validation.jsonl", [json.dumps({"sentence": "fine", "label": 1})])
    with pytest.raises(DataError) as error:
        load_spec(f"json:{tmp_path}")
    message = str(error.value)
    assert "\n" not in message and "check that each file is json" not in message
    assert message == (
        f"the data files' columns differ: {tmp_path / 'train.jsonl'} has ['label', 'text'], "
        f"{tmp_path / 'validation.jsonl'} has ['label', 'sentence'] (text only in the first, "
        "sentence only in the second); every file of every split needs the same columns: "
        "rename or drop columns until they match"
    )


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path):
    # datasets read the second column as output.1, which nothing trained on
    (tmp_path / "train.csv").write_text("instruction,output,output\nsay hi,hi,hello\n")
    with pytest.raises(DataError) as error:
        load_spec(f"csv:{tmp_path}")
    assert str(error.value) == (
        f"{tmp_path / 'train.csv'} names the column 'output' 2 times (columns 2, 3 of its "
        "header); give each column its own name, or delete the extra one"
    )
    (tmp_path / "train.csv").write_text("instruction,output,note\nsay hi,hi,hello\n")
    assert load_spec(f"csv:{tmp_path}")["train"].column_names == ["instruction", "output", "note"]


def test_rows_nested_past_the_depth_bound_are_refused_before_pyarrow_reads_them(tmp_path):
    """pyarrow's JSON reader crashes the process on a row nested some thousands of levels
    deep: rows deeper than 32 levels are refused with their line before it runs. Brackets in
    strings, after escaped quotes and backslashes, are text, not nesting."""
    tricky = {"text": 'a "quoted [[[" \\ { text', "label": 1, "x": [[[]]]}
    lines = [json.dumps(ROWS[0]), json.dumps(tricky) + "  ", json.dumps(ROWS[1])]
    deep = 31 * "[" + 31 * "]"  # the row's object and 31 lists: 32 levels
    lines.append('{"text": "x", "label": 0, "x": ' + deep + "}")
    folder = jsonl(tmp_path / "d", "train.jsonl", lines)
    assert load_spec(f"json:{folder}", cache_dir=tmp_path / "c")["train"].num_rows == 4
    for levels in (32, 100_000):
        deep = levels * "[" + levels * "]"
        lines[2] = '{"text": "x [[", "label": 0, "x": ' + deep + "}"
        folder = jsonl(tmp_path / f"e{levels}", "train.jsonl", lines)
        with pytest.raises(
            DataError,
            match=r"train.jsonl line 3 nests its JSON deeper than 32 levels, which no row of data "
            r"needs \(and which crashes the JSON reader\): flatten or delete that row",
        ):
            load_spec(f"json:{folder}", cache_dir=tmp_path / "c")
