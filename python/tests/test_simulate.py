"""lazyprefill.simulate against `lazyprefill simulate --json`, its arrays, and its refusals."""
import itertools
import math

import numpy as np
import pytest

import lazyprefill as lp
import conftest
from conftest import cli_error

# A grid over the options that change the path through the simulator: dense, MoE and sliding-window
# models, pruned and not, decoding or not, tensor and pipeline parallelism, precisions.
CASES = [
    dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=4096),
    dict(model_config="llama-3.1-8b", hw="h100-sxm,l4", prune="lazyllm", prompt_tokens=8192, new_tokens=33),
    dict(model_config="llama-3.1-8b", hw="a100-80gb", prune="lazyllm", schedule="0.25:0.5", prompt_tokens=2048,
         new_tokens=8, revival_share=0.1),
    dict(model_config="llama-3.1-70b", hw="h100-sxm", prune="lazyllm", prompt_tokens=16384, tp=4),
    dict(model_config="llama-3.1-70b", hw="h200", prompt_tokens=8192, tp=2, pp=2, pp_microbatches=4),
    dict(model_config="qwen3-30b-a3b", hw="h100-sxm", prune="lazyllm", prompt_tokens=4096, new_tokens=4, tp=2, ep=2),
    dict(model_config="gemma-3-12b", hw="l4", prune="lazyllm", prompt_tokens=4096, weights="fp8", compute="fp8",
         kv="fp8"),
    dict(model_config="llama-3.1-8b", hw="xeon-avx512", prune="static-paper", prompt_tokens=1024, new_tokens=3,
         weights="q4", compute="int8", kv="f16", engine="llamacpp"),
    dict(model_config="llama-3.1-8b", hw="h100-sxm", prune="lazyllm", prompt_tokens=1000, new_tokens=20,
         step_times=5, per_layer=True),
]


def cli_args(case):
    return conftest.cli_args("simulate", case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_same_document_as_the_cli(cli, case):
    assert lp.simulate(**case).to_dict() == cli(*cli_args(case))


def test_typed_results_are_the_documents_numbers_in_si_units():
    r = lp.simulate(model_config="llama-3.1-8b", hw="h100-sxm,l4", prune="lazyllm", prompt_tokens=8192,
                    new_tokens=65, per_layer=True)
    d = r.to_dict()
    assert [x.hw.name for x in r.results] == ["h100-sxm", "l4"]
    assert r.decode_steps == 64 and r.prompt_tokens == 8192 and r.policy == "lazyllm"
    names = lp.OpCosts.names
    for res, rd in zip(r.results, d["results"]):
        p, b = res.pruned, res.unpruned
        assert p.ttft_s * 1e3 == rd["ttft_ms"] and b.ttft_s * 1e3 == rd["baseline_ttft_ms"]
        assert res.ttft_speedup == rd["ttft_speedup"] > 1
        assert p.decode_step_s.shape == (64,) and p.decode_step_s.dtype == np.float64
        assert list(p.decode_step_s * 1e3) == rd["decode_step_ms"]
        assert p.memory.total == rd["memory_bytes"]["total"]
        assert res.fits_in_memory == rd["fits_in_memory"]
        ops = p.prefill_ops
        assert ops.time_s.shape == (len(names),)
        for i, name in enumerate(names):
            if ops.calls[i] > 0:
                assert ops.time_s[i] * 1e3 == rd["prefill_ops"][name]["time_ms"]
                assert ops.flop[i] == rd["prefill_ops"][name]["flop"]
            else:
                assert name not in rd["prefill_ops"]
        layers = p.prefill_layers
        assert layers.time_s.shape == (32, len(names)) and len(rd["prefill_layers"]) == 32
        # The layers' costs sum to the prefill's, but for the embedding and the LM head.
        inner = [i for i, n in enumerate(names) if n not in ("embed", "output_norm", "lm_head")]
        assert np.allclose(layers.time_s.sum(axis=0)[inner], ops.time_s[inner], rtol=1e-12)
        assert p.prefill_flop == rd["prefill_flop"]
    with pytest.raises(ValueError):
        np.asarray(r.results[0].pruned.decode_step_s)[0] = 1.0  # read-only


def test_per_layer_costs_are_there_without_per_layer_which_only_adds_them_to_the_document():
    r = lp.simulate(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=512)
    assert r.results[0].pruned.prefill_layers.time_s.shape == (32, len(lp.OpCosts.names))
    assert "prefill_layers" not in r.to_dict()["results"][0]


def test_unpruned_work_is_its_own_baseline():
    r = lp.simulate(model_config="llama-3.1-8b", hw="l4", prompt_tokens=3000, new_tokens=5)
    res = r.results[0]
    assert res.ttft_speedup == 1 and res.total_speedup == 1


# Bad input: the library's one line, word for word what the CLI prints, as a lazyprefill.Error
# (a ValueError).
BAD = [
    (dict(tp=0), "--tp must be between 1 and 4096, got 0"),
    (dict(prompt_tokens=-5), "--prompt-tokens must be between 0 and 16777216, got -5"),
    (dict(prune="lazyllm", new_tokens=2, revival_share=1.5), "--revival-share must be between 0 and 1, got 1.5"),
    (dict(prune="lazyllm", new_tokens=2, revival_share=math.nan), "--revival-share must be between 0 and 1, got nan"),
    (dict(pp_link_gbs=math.nan, pp=2), "--pp-link-gbs must be positive, got nan"),
    (dict(pp_link_gbs=-1.0, pp=2), "--pp-link-gbs must be positive, got -1"),
    (dict(pp_microbatches=2), "--pp-microbatches 2 needs --pp of 2 or more"),
    (dict(step_times=-1), "--step-times must be between 0 and 1048576, got -1"),
    (dict(ep=0), "--ep must be between 1 and 4096, got 0"),
    (dict(moe_imbalance=0.5), None),
    (dict(hw="h999"), None),
    (dict(model_config="no-such-model"), None),
    (dict(weights="int3"), None),
    (dict(tp=3), None),
    (dict(new_tokens=-1), "--new-tokens must be between 0 and 1048576, got -1"),
]


@pytest.mark.parametrize("bad,message", BAD, ids=lambda x: str(x))
def test_bad_input_is_the_clis_error(cli, bad, message):
    case = dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=100) | bad
    with pytest.raises(lp.Error) as e:
        lp.simulate(**case)
    assert isinstance(e.value, ValueError)
    assert cli_error(cli(*cli_args(case), expect_ok=False)) == str(e.value)
    if message is not None:
        assert str(e.value) == message


@pytest.mark.parametrize("kwargs", [dict(tp="2"), dict(prompt_tokens=1.5), dict(hw=3), dict(no_such_option=1),
                                    dict(model_config=7)])
def test_wrong_types_and_unknown_options_are_type_errors(kwargs):
    with pytest.raises(TypeError):
        lp.simulate(**(dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_tokens=100) | kwargs))


def test_positional_arguments_are_refused():
    with pytest.raises(TypeError):
        lp.simulate("h100-sxm")


def test_a_sweep_of_1000_configurations():
    hws = [lp.Profile.load(n) for n in ("h100-sxm", "a100-80gb", "l4", "h200", "b200")]
    lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 100000, 3000, 12000]
    grid = list(itertools.product(hws, lengths, ["none", "lazyllm"], [1, 2], [0, 2, 8, 32, 128]))
    assert len(grid) == 1000
    ttft = {}
    for hw, n, prune, tp, new in grid:
        r = lp.simulate(model_config="llama-3.1-8b", hw=hw, prompt_tokens=n, prune=prune, tp=tp, new_tokens=new,
                        step_times=0)
        res = r.results[0]
        assert res.pruned.ttft_s > 0 and math.isfinite(res.pruned.ttft_s)
        assert res.pruned.decode_step_s.shape == (0,)
        if prune == "none":
            assert res.ttft_speedup == 1
        ttft[(hw.name, n, prune, tp, new)] = res.pruned.ttft_s
    # Longer prompts take longer, pruned or not.
    for (hw, n, prune, tp, new), t in ttft.items():
        longer = (hw, 2 * n, prune, tp, new)
        if longer in ttft:
            assert ttft[longer] > t
