"""lazyprefill.simulate_serving against `lazyprefill simulate-serving --json`, its arrays, its refusals."""
import math

import numpy as np
import pytest

import lazyprefill as lp
import conftest
from conftest import cli_error

BASE = dict(model_config="llama-3.1-8b", requests=60, kv_budget_mib=40000)

# The paths through the serving simulation: rates, a closed loop, the capacity search, on-demand K/V,
# the prefix cache, replicas behind a router, disaggregated prefill and decode, pipeline stages, MoE.
CASES = [
    dict(hw="h100-sxm", rate=[1, 4], prompt_tokens=4096, output_tokens=32),
    dict(hw="h100-sxm,l4", prune="lazyllm", rate=2, prompt_tokens="2048:8192", output_tokens="16:64", seed=7),
    dict(hw="a100-80gb", rate=math.inf, concurrency=8, prompt_tokens=2048, warmup=4, cooldown=4),
    dict(hw="h100-sxm", engine="vllm", kv_mode="on-demand", max_seqs=16, rate=8, prompt_tokens=8192,
         kv_budget_mib=2000),
    dict(hw="h100-sxm", prefix_cache=True, shared_prefix="2048:4", rate=3, prompt_tokens=1024),
    dict(hw="h100-sxm", replicas=2, router="least-outstanding", rate=6, prompt_tokens=4096),
    dict(hw="h100-sxm", disaggregate="1:2", prefill_hw="h200", rate=4, prompt_tokens=8192, output_tokens=64),
    dict(hw="h100-sxm", prune="lazyllm", capacity=True, slo_ttft_p90_ms=400, slo_itl_p90_ms=40, seeds=1,
         prompt_tokens=4096, tolerance=0.05),
    dict(hw="h200", model_config="llama-3.1-70b", tp=4, pp=2, rate=1, prompt_tokens=4096),
    dict(hw="h100-sxm", model_config="qwen3-30b-a3b", tp=2, ep=2, rate=2, prompt_tokens=2048, weights="fp8",
         compute="fp8", kv="fp8", max_batch_tokens=4096, chunk_tokens=1024, iteration_overhead_ms=0.5),
]


def cli_args(case):
    return conftest.cli_args("simulate-serving", case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items() if k != "hw"))
def test_same_document_as_the_cli(cli, case):
    case = BASE | case
    assert lp.simulate_serving(**case).to_dict() == cli(*cli_args(case))


def test_runs_metrics_and_arrays_in_si_units():
    r = lp.simulate_serving(**BASE, hw="h100-sxm,l4", rate=[1, 2], prompt_tokens=4096, keep_requests=True)
    d = r.to_dict()
    assert [(x.hw, x.method, x.rate) for x in r.runs] == [
        (h, m, q) for h in ("h100-sxm", "l4") for m in ("none", "lazyllm") for q in (1.0, 2.0)]
    for run, rd in zip(r.runs, d["results"]):
        m = run.metrics
        assert m.ttft.p90 * 1e3 == rd["metrics"]["ttft_ms"]["p90"]
        assert m.requests_per_s == rd["metrics"]["requests_per_s"] and m.requests == 60
        kv = run.kv
        assert kv.ndim == 2 and kv.shape[1] == 3 and kv.shape[0] == len(rd["kv_mib_over_time"]["points"])
        assert np.array_equal(kv[:, 1] / 2**20, [p[1] for p in rd["kv_mib_over_time"]["points"]])
        reqs = run.requests
        assert reqs["ttft_s"].shape == (60,)
        assert np.all(np.diff(reqs["arrival_s"]) >= 0)  # arrival order
        assert np.allclose(reqs["ttft_s"], reqs["first_token_s"] - reqs["arrival_s"])
        # The metrics are the requests' (numpy's linear percentile, as the library's).
        assert np.percentile(reqs["ttft_s"], 90) == pytest.approx(m.ttft.p90, rel=1e-12)
        assert set(reqs["prompt_tokens"]) == {4096.0}
    plain = lp.simulate_serving(**BASE, hw="h100-sxm", rate=1, prompt_tokens=1024)
    assert plain.runs[0].requests["ttft_s"].shape == (0,)


def test_capacity_runs_are_typed():
    r = lp.simulate_serving(**BASE, hw="h100-sxm", capacity=True, slo_ttft_p90_ms=300, seeds=1,
                            prompt_tokens=4096, tolerance=0.05)
    assert [c.method for c in r.capacities] == ["none", "lazyllm"] and r.runs == []
    for c in r.capacities:
        assert c.met and c.rate_min <= c.rate <= c.rate_max and c.at_rate.ttft.p90 <= 0.3
    assert r.capacities[1].rate > r.capacities[0].rate  # pruning's shorter prefill holds more


BAD = [
    (dict(requests=0), "--requests must be between 1 and 16777216, got 0"),
    (dict(cv=0.0), "--cv must be between 0.01 and 100, got 0"),
    (dict(kv_budget_mib=math.nan), "--kv-budget-mib must be between 1 and 1073741824, got nan"),
    (dict(concurrency=0), "--concurrency must be between 1 and 16777216, got 0"),
    (dict(tolerance=0.9), "--tolerance must be between 0.0001 and 0.5, got 0.9"),
    (dict(max_batch_tokens=0), "--max-batch-tokens must be between 1 and 16777216, got 0"),
    (dict(warmup=40, cooldown=20), "--warmup 40 and --cooldown 20 leave none of the 60 requests to measure"),
    (dict(capacity=True), "--capacity needs --slo-ttft-p90-ms and/or --slo-itl-p90-ms"),
    (dict(tp=3), None),
    (dict(prompt_tokens="9:3"), None),
    (dict(disaggregate="2"), None),
    (dict(hw="h100-sxm,l4", replicas=2), "--replicas and --disaggregate take one --hw"),
]


@pytest.mark.parametrize("bad,message", BAD, ids=lambda x: str(x))
def test_bad_input_is_the_clis_error(cli, bad, message):
    case = BASE | dict(hw="h100-sxm", prompt_tokens=1024) | bad
    with pytest.raises(lp.Error) as e:
        lp.simulate_serving(**case)
    assert cli_error(cli(*cli_args(case), expect_ok=False)) == str(e.value)
    if message is not None:
        assert str(e.value) == message


@pytest.mark.parametrize("kwargs", [dict(rate="fast"), dict(rate=[1, None]), dict(prompt_tokens=2.5),
                                    dict(requests="10"), dict(no_such_option=True), dict(seed=-1)])
def test_wrong_types_are_type_errors(kwargs):
    with pytest.raises(TypeError):
        lp.simulate_serving(**(BASE | dict(hw="h100-sxm") | kwargs))


@pytest.mark.parametrize("rate", [0, -1, math.nan])
def test_rates_must_be_positive(rate):
    with pytest.raises(lp.Error, match="--rate: .* is not a positive number of requests/s"):
        lp.simulate_serving(**BASE, hw="h100-sxm", rate=rate)
