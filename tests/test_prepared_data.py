import json

import pytest

from eaglewatch.errors import UserError
from eaglewatch.pipeline.prepared_data import load_prepared


def write(tmp_path, lines):
    path = tmp_path / "prepared.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


GOOD = {"id": "s1", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}


@pytest.mark.parametrize("bad, why", [
    ("{oops", "not valid JSON"),
    ({"id": "x", "input_ids": [1]}, "missing field"),
    ({"id": "x", "input_ids": [1, 2], "loss_mask": [1]}, "loss_mask has 1 entries but input_ids has 2"),
    ({"id": "x", "input_ids": [1, "a"], "loss_mask": [1, 1]}, "list of integers"),
    ({"id": "x", "input_ids": [1, 5000], "loss_mask": [1, 1]}, "token id 5000 is outside the model's vocabulary"),
    ({"id": "../etc", "input_ids": [1], "loss_mask": [1]}, "cannot name a file"),
    ({"id": "s1", "input_ids": [1], "loss_mask": [1]}, "already used on line 1"),
    ({"id": "x", "input_ids": [1], "loss_mask": [2]}, "0 and 1"),
])
def test_bad_lines_name_file_and_line(tmp_path, bad, why):
    path = write(tmp_path, [GOOD, bad])
    with pytest.raises(UserError, match=why) as info:
        load_prepared(path, vocab_size=1024, max_seq_len=16)
    assert f"{path}:2:" in str(info.value)


def test_long_samples_truncate_or_reject(tmp_path):
    long = {"id": "long", "input_ids": list(range(10)), "loss_mask": [1] * 10}
    path = write(tmp_path, [GOOD, long])
    report = load_prepared(path, vocab_size=1024, max_seq_len=4)
    assert report.truncated == 1 and report.samples[1].input_ids == [0, 1, 2, 3]
    with pytest.raises(UserError, match=r":2: 10 tokens is longer than --max-seq-len 4"):
        load_prepared(path, vocab_size=1024, max_seq_len=4, long_samples="reject")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_prepared(tmp_path / "nope.jsonl", vocab_size=10, max_seq_len=4)
    with pytest.raises(UserError, match="holds no samples"):
        load_prepared(write(tmp_path, ["", "  "]), vocab_size=10, max_seq_len=4)
