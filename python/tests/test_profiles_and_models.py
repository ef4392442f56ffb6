"""Hardware profiles and model presets as objects: listed, loaded, modified, passed back."""
import json
import math

import pytest

import lazyprefill as lp
from conftest import cli_error


def test_profiles_are_listed_and_loaded_in_si_units():
    names = lp.Profile.names()
    assert "h100-sxm" in names and "xeon-avx512" in names and names == sorted(names)
    p = lp.Profile.load("h100-sxm")
    doc = p.to_dict()
    assert p.name == doc["name"] == "h100-sxm" and p.kind == "gpu"
    assert p.memory_bandwidth == doc["memory_bandwidth_gbs"] * 1e9
    assert p.memory_capacity == doc["memory_capacity_gib"] * 2**30
    assert p.peak_flops["bf16"] == doc["peak_tflops"]["bf16"] * 1e12
    assert p.engine == "vllm" and p.with_engine("trtllm").engine == "trtllm"
    assert set(lp.engine_names()) >= {"vllm", "sglang", "trtllm", "llamacpp", "lazyprefill"}


def test_a_replaced_profile_predicts_as_the_same_file_does(cli, tmp_path):
    p = lp.Profile.load("h100-sxm").replace(memory_bandwidth_gbs=4800, memory_capacity_gib=141)
    assert p.memory_bandwidth == 4.8e12 and p.name == "h100-sxm"
    path = tmp_path / "faster.json"
    path.write_text(p.to_json())
    assert lp.Profile.load(str(path)).memory_bandwidth == 4.8e12
    case = dict(model_config="llama-3.1-8b", prune="lazyllm", prompt_tokens=4096, new_tokens=9)
    r = lp.simulate(hw=p, **case)
    assert r.to_dict() == cli("simulate", "--json", "--hw", path, "--model-config", "llama-3.1-8b", "--prune",
                              "lazyllm", "--prompt-tokens", 4096, "--new-tokens", 9)
    slower = lp.simulate(hw="h100-sxm", **case).results[0].pruned
    assert r.results[0].pruned.decode_step_mean_s < slower.decode_step_mean_s
    # Profiles and names mix in one call, in order.
    both = lp.simulate(hw=[p, "l4"], **case)
    assert [x.hw.name for x in both.results] == ["h100-sxm", "l4"]


@pytest.mark.parametrize("fields,words", [
    (dict(memory_bandwidth_gbs=-1), "h100-sxm (replaced): field 'memory_bandwidth_gbs' must be greater than 0, got -1"),
    (dict(memory_bandwidth_gbs="fast"), "memory_bandwidth_gbs"),
    (dict(peak_tflops={"bf16": 989.4, "int3": 1}), "unknown dtype 'int3'"),
    (dict(no_such_field=1), "Profile.replace: 'no_such_field' is not a field of h100-sxm's document"),
    (dict(memory_bandwidth_gbs=math.inf), "memory_bandwidth_gbs: not a JSON document"),
])
def test_an_inconsistent_profile_is_refused_with_the_files_words(fields, words):
    with pytest.raises(ValueError) as e:
        lp.Profile.load("h100-sxm").replace(**fields)
    assert words in str(e.value)


def test_a_profile_dict_is_checked_as_a_file_is(cli, tmp_path):
    doc = lp.Profile.load("l4").to_dict()
    doc["efficiency"]["gemm"]["compute"] = 1.5
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(lp.Error) as e:
        lp.Profile.from_dict(doc, origin=str(path))
    p = cli("simulate", "--hw", path, "--model-config", "llama-3.1-8b", "--prompt-tokens", 10, expect_ok=False)
    assert cli_error(p) == str(e.value)
    with pytest.raises(lp.Error, match="unknown hardware 'h999'"):
        lp.Profile.load("h999")
    with pytest.raises(TypeError):
        lp.Profile.from_dict([1, 2])


def test_presets_are_listed_loaded_modified_and_passed_back(cli, tmp_path):
    names = lp.Model.names()
    assert {"llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-12b"} <= set(names)
    m = lp.Model.preset("llama-3.1-8b")
    assert (m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.n_vocab) == (32, 4096, 32, 8, 128256)
    assert 8.0e9 < m.n_params < 8.1e9 and m.n_active_params == m.n_params
    half = m.replace(n_layer=16, name="llama-half")
    assert half.n_layer == 16 and m.n_layer == 32
    path = tmp_path / "half.json"
    path.write_text(half.to_json())
    case = dict(hw="h100-sxm", prune="lazyllm", prompt_tokens=2048, new_tokens=3)
    mine = lp.simulate(model_config=half, **case)
    assert mine.to_dict() == lp.simulate(model_config=str(path), **case).to_dict()
    assert mine.to_dict() == cli("simulate", "--json", "--model-config", path, "--hw", "h100-sxm", "--prune", "lazyllm",
                                 "--prompt-tokens", 2048, "--new-tokens", 3)
    full = lp.simulate(model_config=m, **case).results[0].unpruned.ttft_s
    assert mine.results[0].unpruned.ttft_s < full
    moe = lp.Model.preset("qwen3-30b-a3b")
    assert moe.n_expert == 128 and moe.n_active_params < moe.n_params
    assert lp.Model.from_dict(moe.to_dict()).to_dict() == moe.to_dict()


@pytest.mark.parametrize("fields,words", [
    (dict(n_head=7), "model (replaced)"),
    (dict(n_layer=0), "n_layer must be positive, got 0"),
    (dict(n_layers=3), "Model.replace: unknown field 'n_layers'"),
    (dict(n_embd=2.5), "n_embd"),
])
def test_an_inconsistent_model_is_refused(fields, words):
    with pytest.raises(lp.Error) as e:
        lp.Model.preset("llama-3.1-8b").replace(**fields)
    assert words in str(e.value).replace("llama-3.1-8b (replaced)", "model (replaced)")


def test_a_target_is_given_once():
    with pytest.raises(lp.Error, match="give one target"):
        lp.simulate(model_config=lp.Model.preset("llama-3.1-8b"), model="x.gguf", hw="l4", prompt_tokens=10)
    with pytest.raises(lp.Error, match="--model-config"):
        lp.simulate(hw="l4", prompt_tokens=10)


def test_a_deeply_nested_document_is_an_error_not_a_crash():
    deep = {}
    node = deep
    for _ in range(400):  # under Python's recursion limit, over the parser's 256 levels
        node["x"] = {}
        node = node["x"]
    with pytest.raises(lp.Error, match="nested deeper than 256 levels"):
        lp.Model.preset("llama-3.1-8b").replace(name=deep)
    with pytest.raises(lp.Error, match="nested deeper than 256 levels"):
        lp.Profile.from_dict({"nested": deep})
