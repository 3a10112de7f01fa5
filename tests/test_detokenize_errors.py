"""Bad tokenizer files and ids outside the vocabulary: one-line errors naming the file or id and the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tokenpath.config.errors import UserError
from tokenpath.delivery import Detokenizer, TokenIdError


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("content, message", [
    (b"\x00\x01 not a model", "neither JSON nor a SentencePiece model"),
    (b"{ broken", "broken JSON"),
    (b'{"hello": 1}', "neither a Tekken file"),
    (b'{"config": {"default_vocab_size": 10}, "vocab": []}', "not a valid Tekken file"),
    (b'{"model": {"type": "BPE"}}', "cannot read it"),
])
def test_an_unreadable_or_unsupported_file_is_named(tmp_path, content, message):
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(content)
    with pytest.raises(UserError) as error:
        Detokenizer.load(path)
    assert message in one_line(error) and str(path) in str(error.value)


def test_a_missing_file_lists_the_embedded_names():
    with pytest.raises(UserError) as error:
        Detokenizer.load("no-such-tokenizer.json")
    assert "no such file" in one_line(error) and "tekken_240911.json" in str(error.value)


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(UserError, match="is a folder"):
        Detokenizer.load(tmp_path)


def test_an_unsupported_hugging_face_decoder_is_named(tmp_path):
    from tokenizers import Tokenizer, decoders, models

    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    with pytest.raises(UserError) as error:
        Detokenizer.load(path)
    assert "'WordPiece' is not supported" in one_line(error) and "ByteLevel" in str(error.value)


def test_an_id_outside_the_vocabulary_is_named_and_the_stream_keeps_serving_the_rest():
    det = Detokenizer.load("tokenizer.model.v1")
    hello, world = det.encode("Hello world")
    stream = det.batch(3)
    assert stream.step([hello, hello, hello]) == ["Hello"] * 3
    with pytest.raises(TokenIdError) as error:
        stream.step([world, 32000, world])
    assert "id 32000 at sequence 1" in one_line(error) and "tokenizer.model.v1" in str(error.value)
    assert (error.value.sequences, error.value.ids) == ([1], [32000])
    # The server answers request 1 with an error, ends its slot and repeats the step without it.
    stream.finish([1])
    assert stream.step([world, -1, world]) == [" world", "", " world"]
    assert stream.finish() == ["", "", ""]


def test_negative_ids_mean_no_token():
    det = Detokenizer.load()
    stream = det.batch(2)
    ids = det.encode("Hi")
    assert stream.step(np.array([ids[0], -7])) == ["Hi", ""]


def test_the_reference_decode_refuses_ids_outside_the_vocabulary():
    det = Detokenizer.load()
    with pytest.raises(TokenIdError, match="id 131072 at sequence 0"):
        det.decode([131072])


def test_a_wrong_shape_is_a_programming_error():
    stream = Detokenizer.load().batch(2)
    with pytest.raises(ValueError, match="one id per sequence"):
        stream.step([1, 2, 3])


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nothing": True}))
    result = subprocess.run([sys.executable, "-m", "tokenpath", "calibrate", "delivery", "--tokenizer", str(bad),
                             "--out", str(tmp_path / "x.toml")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in result.stderr
