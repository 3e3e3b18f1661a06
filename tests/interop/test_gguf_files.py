"""Damaged and hostile GGUF files, written byte by byte: each is refused with one line that names
the file and the reason (what the `gguf` package's reader raises is caught at zoo's boundary),
before anything of the size a count claims is allocated or looped over."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

import zoo
from zoo.cli import main
from zoo.interop.gguf import GGUFError, read_gguf, read_tensors
from zoo.interop.gguf.model import hf_config, hf_name

pytestmark = pytest.mark.hf
pytest.importorskip("gguf")

U32, U64, F32, STRING, ARRAY = 4, 10, 6, 8, 9


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def entry(key: str, code: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", code) + payload


def info(name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    sizes = struct.pack(f"<{len(dims)}Q", *dims)
    return (
        string(name) + struct.pack("<I", len(dims)) + sizes + struct.pack("<IQ", ggml_type, offset)
    )


def gguf_bytes(entries=(), tensors=(), data=b"", *, version=3, counts=None) -> bytes:
    """A GGUF file: header, metadata `entries`, tensor `tensors` (infos), aligned `data`."""
    tensor_count, entry_count = counts or (len(tensors), len(entries))
    body = b"GGUF" + struct.pack("<IQQ", version, tensor_count, entry_count)
    body += b"".join(entries) + b"".join(tensors)
    body += b"\0" * (-len(body) % 32)
    return body + data


ARCH = entry("general.architecture", STRING, string("llama"))


def write(tmp_path, content: bytes, name: str = "model.gguf"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def refused(path, match: str) -> str:
    with pytest.raises(GGUFError, match=match) as caught:
        read_gguf(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_sound_file_is_read(tmp_path):
    values = np.arange(64, dtype=np.float32)
    meta = [ARCH, entry("x.list", ARRAY, struct.pack("<IQ", U32, 3) + struct.pack("<3I", 7, 8, 9))]
    meta.append(entry("x.words", ARRAY, struct.pack("<IQ", STRING, 2) + string("a") + string("bé")))
    meta += [entry("x.flag", 7, b"\x01"), entry("x.eps", F32, struct.pack("<f", 0.25))]
    path = write(tmp_path, gguf_bytes(meta, [info("w", (16, 4), 0, 0)], values.tobytes()))
    file = read_gguf(path)
    assert file.metadata == {
        "general.architecture": "llama",
        "x.list": [7, 8, 9],
        "x.words": ["a", "bé"],
        "x.flag": True,
        "x.eps": 0.25,
    }
    assert file.tensors["w"].shape == (4, 16)  # GGUF lists the fastest dimension first
    [(name, array)] = list(read_tensors(file))
    assert name == "w"
    np.testing.assert_array_equal(array, values.reshape(4, 16))
    assert not np.shares_memory(array, file.tensors["w"].data)  # a copy, not the mapped file


def test_bad_magic_and_versions(tmp_path):
    refused(write(tmp_path, b"GGML" + bytes(40)), r"not a GGUF file: it starts with b'GGML'")
    refused(
        write(tmp_path, gguf_bytes(version=1)),
        r"GGUF version 1 is not supported; zoo reads versions 2, 3",
    )
    big_endian = gguf_bytes()[:4] + struct.pack(">I", 3) + gguf_bytes()[8:]
    refused(write(tmp_path, big_endian), "big-endian")


def test_truncated_files(tmp_path):
    refused(write(tmp_path, b"GGUF\x03\0"), r"truncated: 6 bytes, fewer than a GGUF header's 24")
    whole = gguf_bytes([ARCH, entry("general.name", STRING, string("tiny model"))])
    refused(
        write(tmp_path, whole[:-20]),
        r"truncated or damaged: the header needs 10 bytes at byte 101, past the end of its 108",
    )
    values = np.zeros(64, np.float32).tobytes()
    cut = gguf_bytes([ARCH], [info("w", (64,), 0, 0)], values)[:-8]
    refused(write(tmp_path, cut), r"a tensor's data needs 256 bytes at byte 128, past the end")


def test_absurd_counts_and_lengths_are_refused_before_allocating(tmp_path):
    refused(
        write(tmp_path, gguf_bytes(counts=(2**60, 0))),
        r"it claims 1152921504606846976 tensors and 0 metadata entries, more than its 32 bytes",
    )
    refused(write(tmp_path, gguf_bytes(counts=(0, 2**40))), r"1099511627776 metadata entries, more")
    huge_string = struct.pack("<Q", 2**62)  # a key 2**62 bytes long
    refused(
        write(tmp_path, gguf_bytes([huge_string], data=bytes(16), counts=(0, 1))),
        r"the header needs 4611686018427387904 bytes at byte 32",
    )
    # arrays claiming 2**61 elements: the package's reader would loop over them one by one
    started = time.perf_counter()
    for element in (STRING, 0):  # strings, uint8
        huge_array = entry("tokens", ARRAY, struct.pack("<IQ", element, 2**61))
        refused(
            write(tmp_path, gguf_bytes([huge_array], data=bytes(2**20))),
            r"an array at byte 42 claims 2305843009213693952 elements, more than the 1048\d+ bytes",
        )
    assert time.perf_counter() - started < 5
    nested = struct.pack("<IQ", ARRAY, 1) * 3000 + struct.pack("<IQ", U32, 0)
    refused(
        write(tmp_path, gguf_bytes([entry("deep", ARRAY, nested)])),
        r"RecursionError: its metadata nests arrays too deeply",
    )
    dims = info("w", (32, 1, 1, 1, 1), 0, 0)
    refused(
        write(tmp_path, gguf_bytes([ARCH], [dims], bytes(128))),
        r"tensor w has 5 dimensions; GGUF allows 1..4",
    )


def test_counts_strings_and_arrays_past_zoos_bounds_are_refused(tmp_path, monkeypatch):
    """Each bound, made small: a file the size of a real one may still claim more than any
    real model holds (the package's reader walks every array element in Python)."""
    from zoo.interop.gguf import reader

    for name, value in [
        ("MAX_TENSORS", 2),
        ("MAX_ENTRIES", 3),
        ("MAX_STRING_BYTES", 64),
        ("MAX_ARRAY_ELEMENTS", 8),
        ("MAX_METADATA_ELEMENTS", 12),
        ("MAX_METADATA_BYTES", 100),
    ]:
        monkeypatch.setattr(reader, name, value)
    data = np.zeros(3 * 16, np.float32).tobytes()
    tensors = [info(f"w{i}", (16,), 0, 64 * i) for i in range(3)]
    refused(
        write(tmp_path, gguf_bytes([ARCH], tensors, data)),
        r"it claims 3 tensors, past zoo's bound of 2 \(a real model's file holds far fewer; the",
    )
    many = [entry(f"k{i}", U32, bytes(4)) for i in range(4)]
    refused(
        write(tmp_path, gguf_bytes(many)), r"it claims 4 metadata entries, past zoo's bound of 3"
    )
    long = entry("general.name", STRING, string("x" * 65))
    refused(
        write(tmp_path, gguf_bytes([long])),
        r"its header holds a string of 65 bytes at byte \d+, past zoo's bound of 64 bytes",
    )
    words = [entry(f"w{i}", STRING, string("x" * 40)) for i in range(3)]  # 40 + 2-byte keys
    refused(write(tmp_path, gguf_bytes(words)), r"holds 126 bytes of strings at byte \d+, past")

    def array(key: str, count: int) -> bytes:
        return entry(key, ARRAY, struct.pack("<IQ", U32, count) + bytes(4 * count))

    assert read_gguf(write(tmp_path, gguf_bytes([array("a", 8)]))).metadata["a"] == [0] * 8
    refused(
        write(tmp_path, gguf_bytes([array("a", 9)])),
        r"its metadata holds an array of 9 elements at byte \d+, past zoo's bound of 8 \(a real",
    )
    refused(
        write(tmp_path, gguf_bytes([array("a", 8), array("b", 5)])),
        r"its metadata holds 13 array elements at byte \d+, past zoo's bound of 12",
    )


def test_damaged_metadata(tmp_path):
    refused(
        write(tmp_path, gguf_bytes([entry("k", STRING, string(b"\xff\xfe"))])),
        r"the gguf package cannot read it \(UnicodeDecodeError: 'utf-8' codec",
    )
    refused(
        write(tmp_path, gguf_bytes([ARCH, ARCH])),
        r"\(KeyError: Duplicate general.architecture already in list",
    )
    refused(
        write(tmp_path, gguf_bytes([entry("k", 77, bytes(8))])),
        r"\(ValueError: .*77.* is not a valid GGUFValueType\): the file is damaged",
    )
    refused(
        write(tmp_path, gguf_bytes([entry("general.alignment", U32, struct.pack("<I", 3))])),
        r"Invalid alignment: must be a non-zero power of two",
    )


def test_tensors_outside_the_file_or_off_alignment(tmp_path):
    data = np.zeros(64, np.float32).tobytes()
    far = gguf_bytes([ARCH], [info("w", (64,), 0, 2**50)], data)
    refused(write(tmp_path, far), r"a tensor's data needs 256 bytes at byte 1125899906842752")
    off = gguf_bytes([ARCH], [info("w", (16,), 0, 4)], data)
    refused(write(tmp_path, off), r"tensor w \(64 bytes at offset 4\) .* off its 32-byte alignment")
    big = gguf_bytes([ARCH], [info("w", (2**31, 2**31), 0, 0)], data)
    refused(write(tmp_path, big), r"needs 18446744073709551616 bytes at byte 128, past the end")
    wraps = gguf_bytes([ARCH], [info("w", (2**32, 2**32), 0, 0)], data)  # 2**64 wraps to 0
    refused(write(tmp_path, wraps), r"cannot reshape array of size 0")
    twice = gguf_bytes([ARCH], [info("w", (16,), 0, 0), info("w", (16,), 0, 64)], data)
    refused(write(tmp_path, twice), r"Found duplicated tensor with name w")


def test_unknown_and_unsupported_quantization_types(tmp_path):
    data = bytes(40 * 8)
    message = refused(
        write(tmp_path, gguf_bytes([ARCH], [info("w", (256,), 9, 0)], data)),
        r"tensor w is stored as Q8_1, which the gguf package does not dequantize",
    )
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"):
        assert f" {name}," in message.split("zoo reads")[1]
    refused(write(tmp_path, gguf_bytes([ARCH], [info("w", (16,), 26, 0)], data)), "stored as I32")
    message = refused(
        write(tmp_path, gguf_bytes([ARCH], [info("w", (32,), 99, 0)], data)),
        r"a tensor has a GGML type zoo does not know \(.*99.*\); zoo reads F32, F16,",
    )
    refused(
        write(tmp_path, gguf_bytes([ARCH], [info("w", (48,), 8, 0)], data)),
        r"row size \(48\) is not a multiple of Q8_0 block size \(32\)",
    )


def test_unsupported_architecture_and_tensors(tmp_path):
    mamba = write(tmp_path, gguf_bytes([entry("general.architecture", STRING, string("mamba"))]))
    with pytest.raises(
        GGUFError,
        match=(
            r"general.architecture 'mamba' is not supported; zoo reads GGUF files of llama, qwen2, "
            r"qwen3, phi3, gemma2, gemma3"
        ),
    ):
        zoo.from_pretrained(mamba)
    file = read_gguf(write(tmp_path, gguf_bytes([ARCH])))
    with pytest.raises(GGUFError, match=r"rope_freqs.weight \(Llama 3.1\+ rope scaling"):
        hf_name(file, "rope_freqs.weight")
    assert hf_name(file, "blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    phi3 = read_gguf(
        write(tmp_path, gguf_bytes([entry("general.architecture", STRING, string("phi3"))]))
    )
    assert hf_name(phi3, "blk.2.attn_qkv.weight") == "model.layers.2.self_attn.qkv_proj.weight"
    assert hf_name(phi3, "blk.2.ffn_up.weight") == "model.layers.2.mlp.gate_up_proj.weight"
    with pytest.raises(GGUFError, match=r"rope_factors_long.weight \(LongRoPE factors"):
        hf_name(phi3, "rope_factors_long.weight")
    with pytest.raises(GGUFError, match="holds no token_embd.weight"):
        hf_config(file)


def u32(key: str, value: int) -> bytes:
    return entry(key, U32, struct.pack("<I", value))


LLAMA_SHAPE = [
    u32("llama.attention.head_count", 2),
    u32("llama.feed_forward_length", 16),
    u32("llama.block_count", 1),
]


def config_of(tmp_path, entries, dims=(4, 8)):
    """`hf_config` of a file with `entries` and a float32 token_embd.weight of GGUF `dims`."""
    embedding = info("token_embd.weight", dims, 0, 0)
    data = np.zeros(int(np.prod(dims)), np.float32).tobytes()
    return hf_config(read_gguf(write(tmp_path, gguf_bytes(entries, [embedding], data))))


def test_metadata_of_the_wrong_type_is_refused_by_its_key(tmp_path):
    config = config_of(tmp_path, [ARCH, *LLAMA_SHAPE])
    assert (config["vocab_size"], config["hidden_size"], config["head_dim"]) == (8, 4, 2)
    wrong = [
        ("llama.attention.head_count", STRING, string("2"), "is '2', not an integer"),
        ("llama.attention.head_count", U32, struct.pack("<I", 0), "is 0; it must be a positive"),
        ("llama.rope.freq_base", STRING, string("high"), "is 'high', not a number"),
        ("tokenizer.ggml.bos_token_id", F32, struct.pack("<f", 0.5), "is 0.5, not an integer"),
    ]
    for key, code, payload, message in wrong:
        kept = [e for e in LLAMA_SHAPE if not e.startswith(string(key))]  # the entry replaced
        with pytest.raises(GGUFError, match=rf"{key} {message}"):
            config_of(tmp_path, [ARCH, *kept, entry(key, code, payload)])
    listed = entry("general.architecture", ARRAY, struct.pack("<IQ", STRING, 1) + string("llama"))
    with pytest.raises(GGUFError, match=r"general.architecture is \['llama'\], not a string"):
        config_of(tmp_path, [listed, *LLAMA_SHAPE])
    with pytest.raises(GGUFError, match=r"token_embd.weight has shape \(32,\), not \(vocab"):
        config_of(tmp_path, [ARCH, *LLAMA_SHAPE], dims=(32,))


def test_a_missing_file_is_named_not_looked_up_on_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent.gguf: no such GGUF file"):
        zoo.from_pretrained(tmp_path / "absent.gguf")


def test_the_command_line_names_the_file(tmp_path, capsys):
    path = write(tmp_path, b"GGML" + bytes(40))
    assert main(["generate", str(path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not a GGUF file" in err and "Traceback" not in err
