"""Preflight's shard checks: every weight file against its own header and the index, on broken copies of a real
tiny model, so that a bad download fails in preflight with the file's name instead of minutes into a load."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from conftest import run_cli
from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.preflight.checks import FAIL, PASS, run_checks

INDEX = "model.safetensors.index.json"


def cfg_for(model, data, out):
    return ExtractConfig(model_path=str(model), prepared_data=str(data), output_dir=str(out), engine="hf",
                         layer_ids=[1, 2, 4], max_seq_len=512)


def shards_result(model, data, tmp_path):
    results = run_checks(cfg_for(model, data, tmp_path / "out"))[0]
    found = [r for r in results if r.name == "shards"]
    assert found, [(r.name, r.status, r.reason) for r in results]
    return found[0]


@pytest.fixture
def model(tiny_llama, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_llama, tmp_path / "m"))


def shard_names(model: Path) -> list[str]:
    return sorted(set(json.loads((model / INDEX).read_text())["weight_map"].values()))


def split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_a_good_model_passes_and_says_the_sizes_were_checked(model, prepared_data, tmp_path):
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == PASS and "sizes match their headers" in result.reason


def test_a_truncated_shard_is_named_with_both_sizes_and_the_fix(model, prepared_data, tmp_path):
    shard = model / shard_names(model)[2]
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 4096)  # an interrupted download
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == FAIL
    assert result.reason == (f"{shard.name} is truncated: {size - 4096} bytes, but its header describes {size} "
                             "(4096 bytes missing)")
    assert result.fix == f"re-download {shard.name} (an interrupted download leaves a short file)"
    (bad,) = result.details["bad_shards"]
    assert (bad["shard"], bad["expected_bytes"], bad["actual_bytes"]) == (shard.name, size, size - 4096)


def test_every_bad_shard_is_counted(model, prepared_data, tmp_path):
    names = shard_names(model)
    for name in names[:3]:
        with open(model / name, "r+b") as f:
            f.truncate(100)  # inside the header
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == FAIL and result.reason.startswith(f"{names[0]} is truncated: 100 bytes, but its header "
                                                               "alone needs")
    assert f"2 more bad: {names[1]}, {names[2]}" in result.reason and "and the 2 other(s)" in result.fix
    assert [b["shard"] for b in result.details["bad_shards"]] == names[:3]


def test_trailing_bytes_and_a_stub_file_fail(model, prepared_data, tmp_path):
    first, second = (model / n for n in shard_names(model)[:2])
    with open(first, "ab") as f:
        f.write(b"\0" * 10)
    second.write_bytes(b"\x01\x02")
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == FAIL and "(10 bytes too many)" in result.reason
    problems = [b["problem"] for b in result.details["bad_shards"]]
    assert problems[1] == f"{second.name} is 2 bytes, too short to hold a safetensors header"


@pytest.mark.parametrize("damage, why", [
    (lambda h, t: h[t].__setitem__("data_offsets", [h[t]["data_offsets"][0] + 4, h[t]["data_offsets"][1] + 4]),
     "leaves a 4-byte gap before it"),
    (lambda h, t: h[t].__setitem__("shape", [*h[t]["shape"], 2]), "needs"),
    (lambda h, t: h[t].__setitem__("data_offsets", [8, 4]), "bad offsets for tensor"),
    (lambda h, t: h[t].__setitem__("shape", "big"), "malformed entry"),
    (lambda h, t: h[t].pop("dtype"), "malformed entry"),
    (lambda h, t: h.__setitem__(t, [1, 2]), "malformed entry"),
])
def test_insane_offsets_or_entries_fail(model, prepared_data, tmp_path, damage, why):
    shard = model / shard_names(model)[0]
    header, data = split(shard)
    tensor = next(k for k in header if k != "__metadata__")
    damage(header, tensor)
    join(shard, header, data)
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == FAIL and shard.name in result.reason and why in result.reason
    assert repr(tensor) in result.reason


@pytest.mark.parametrize("shift, why", [(-4, "overlaps the tensor before it"), (4, "leaves a 4-byte gap before it")])
def test_tensors_must_tile_the_data(model, prepared_data, tmp_path, shift, why):
    """The same tensor names, rewritten as F32 [2] each, back to back; then one moved by ``shift`` bytes."""
    shard = model / shard_names(model)[-1]
    names = sorted(k for k in split(shard)[0] if k != "__metadata__")
    assert len(names) >= 2
    header = {name: {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]} for i, name in enumerate(names)}
    last = header[names[-1]]
    last["data_offsets"] = [o + shift for o in last["data_offsets"]]
    join(shard, header, b"\0" * last["data_offsets"][1])
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == FAIL and result.reason.endswith(f"tensor {names[-1]!r} starts at byte "
                                                            f"{last['data_offsets'][0]} and {why}")


def test_without_an_index_each_file_is_still_checked(model, prepared_data, tmp_path):
    (model / INDEX).unlink()
    assert shards_result(model, prepared_data, tmp_path).status == PASS
    shard = model / shard_names_on_disk(model)[-1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1)
    result = shards_result(model, prepared_data, tmp_path)
    assert result.status == FAIL and f"{shard.name} is truncated" in result.reason and "1 bytes missing" in result.reason


def shard_names_on_disk(model: Path) -> list[str]:
    return sorted(p.name for p in model.glob("*.safetensors"))


@pytest.mark.parametrize("index, why", [
    ([1, 2], "no weight_map"),
    ({"weight_map": []}, "no weight_map"),
    ({"weight_map": {"lm_head.weight": ["a", "b"]}}, "maps to ['a', 'b'], not a file name"),
    ({"weight_map": {"lm_head.weight": "model-00099-of-00008.safetensors"}}, "1 of 1 shards"),
    ("{not json", "not valid JSON"),
])
def test_a_broken_index_fails_the_model_folder_check(model, prepared_data, tmp_path, index, why):
    (model / INDEX).write_text(index if isinstance(index, str) else json.dumps(index))
    results = run_checks(cfg_for(model, prepared_data, tmp_path / "out"))[0]
    assert results[0].name == "model folder" and results[0].status == FAIL and why in results[0].reason


def test_a_non_numeric_total_size_is_not_a_crash(model, prepared_data, tmp_path):
    index = json.loads((model / INDEX).read_text())
    index["metadata"]["total_size"] = "about 2 MB"
    (model / INDEX).write_text(json.dumps(index))
    assert shards_result(model, prepared_data, tmp_path).status == PASS


@pytest.mark.parametrize("config, why", [("[1, 2]", "holds a JSON list, not an object"),
                                         ('{"text_config": 3}', "text_config is a int")])
def test_a_config_that_is_not_an_object_is_a_user_error(tmp_path, config, why):
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(UserError, match=why):
        mi.load_model_info(tmp_path)


@pytest.mark.parametrize("key, value, why", [
    ("num_key_value_heads", "x", 'has num_key_value_heads "x", not a positive whole number'),
    ("hidden_size", 0, "has hidden_size 0, not a positive whole number"),
    ("num_hidden_layers", True, "has num_hidden_layers true"),
    ("architectures", 5, "has architectures 5, not a list of names"),
])
def test_config_values_of_the_wrong_kind_are_user_errors(tiny_llama, tmp_path, key, value, why):
    config = json.loads((tiny_llama / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=why):
        mi.load_model_info(tmp_path, check_shards=False)


def test_a_non_numeric_moe_size_is_a_failed_row(model, prepared_data, tmp_path):
    config = json.loads((model / "config.json").read_text())
    config["moe_intermediate_size"] = "x"
    (model / "config.json").write_text(json.dumps(config))
    results = run_checks(cfg_for(model, prepared_data, tmp_path / "out"))[0]
    moe = [r for r in results if r.name == "MoE split"]
    assert moe and moe[0].status == FAIL and "moe_intermediate_size 'x', not a whole number" in moe[0].reason


def test_config_json_that_is_a_folder_is_a_user_error(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(UserError, match="cannot read"):
        mi.load_model_info(tmp_path)


def test_the_cli_fails_with_the_shard_row(model, prepared_data, tmp_path):
    shard = model / shard_names(model)[-1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    proc = run_cli("preflight", "--engine", "hf", "--no-miniature", "--model-path", model, "--prepared-data",
                   prepared_data, "--output-dir", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert "[FAIL] shards" in proc.stdout and shard.name in proc.stdout and "re-download" in proc.stdout
    assert "Traceback" not in proc.stderr
