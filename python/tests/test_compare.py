"""lazyprefill.compare against `lazyprefill compare --json`, its table as arrays, its refusals."""
import json

import numpy as np
import pytest

import lazyprefill as lp
import conftest
from conftest import cli_error

CASES = [
    dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=[8192, 32768]),
    dict(model_config="llama-3.1-70b", hw="h100-sxm", devices=4, prompt_tokens=16384, weights="fp8",
         compute="fp8", kv="fp8", kv_predict="llama-3.1-8b"),
    dict(model_config="llama-3.1-8b", hw="l4", prompt_tokens=[4096, 65536], schedule=["0.3:0.3", "0.5:0.5"]),
    dict(model_config="qwen3-30b-a3b", hw="a100-80gb", devices=2, prompt_tokens=4096),
]


def cli_args(case):
    return conftest.cli_args("compare", case, repeated=("schedule",))


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_same_document_as_the_cli(cli, case):
    assert lp.compare(**case).to_dict() == cli(*cli_args(case))


def test_the_tables_as_arrays():
    r = lp.compare(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=[4096, 32768])
    d = r.to_dict()
    assert r.ttft_s.shape == (2, len(r.methods)) and list(r.prompt_tokens) == [4096, 32768]
    for i, table in enumerate(r.tables):
        assert [row.method for row in table.rows] == r.methods
        for j, row in enumerate(table.rows):
            rd = d["prompts"][i]["methods"][j]
            assert row.accuracy == rd["accuracy"]
            if row.refused:
                assert np.isnan(r.ttft_s[i, j]) and rd["refused"] == row.note
            else:
                assert r.ttft_s[i, j] * 1e3 == rd["ttft_ms"] == row.ttft_s * 1e3
    plain = r.tables[0].rows[0]
    assert plain.devices == 1 and plain.speedup == 1 and plain.accuracy.startswith("exact")


def test_the_eval_file_gives_lazyllms_accuracy(cli, tmp_path):
    schedule = "0.3:0.3"
    ev = {"model_name": "tiny", "results": [{"counts": True, "methods": [
        {"policy": "lazyllm", "schedule": schedule, "accuracy_change": -0.031}]}]}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(ev))
    case = dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=8192, schedule=[schedule], eval=str(path))
    r = lp.compare(**case)
    assert r.to_dict() == cli(*cli_args(case))
    assert any("worst QA accuracy change -3.1 pt over 1" in row.accuracy for row in r.tables[0].rows)


BAD = [
    (dict(devices=1), "--devices must be between 2 and 1024, got 1"),
    (dict(prompt_tokens=[0]), None),
    (dict(hw="h100-sxm,l4"), "--hw names one profile for compare, got 2"),
    (dict(kv_predict="no-such-model"), None),
    (dict(schedule=["x:y"]), None),
]


@pytest.mark.parametrize("bad,message", BAD, ids=lambda x: str(x))
def test_bad_input_is_the_clis_error(cli, bad, message):
    case = dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=[8192]) | bad
    with pytest.raises(lp.Error) as e:
        lp.compare(**case)
    if bad.get("prompt_tokens") == [0]:  # the CLI's parser refuses the text before the library sees it
        assert str(e.value) == "--prompt-tokens must be between 1 and 16777216, got 0"
        return
    assert cli_error(cli(*cli_args(case), expect_ok=False)) == str(e.value)
    if message is not None:
        assert str(e.value) == message


def test_wrong_types_are_type_errors():
    for kwargs in (dict(prompt_tokens="8192"), dict(prompt_tokens=[1.5]), dict(devices="4"), dict(bogus=1)):
        with pytest.raises(TypeError):
            lp.compare(**(dict(model_config="llama-3.1-8b", hw="h100-sxm") | kwargs))
