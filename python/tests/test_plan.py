"""lazyprefill.plan against `lazyprefill plan --json`, its points typed, its refusals."""
import json

import pytest

import lazyprefill as lp
import conftest
from conftest import cli_error

# Small grids (few budgets, limits and loads; 40 requests a simulation): the search's paths, not its size.
SMALL = dict(requests=40, batch_tokens=[8192], max_seqs=[256], loads=[0.5])
CASES = [
    dict(model_config="llama-3.1-8b", hw="h100-sxm", gpus=4, slo_ttft_p90_ms=2000, slo_itl_p90_ms=50, pp=[1]),
    dict(model_config="llama-3.1-70b", hw="h200", gpus=8, prune="none", aggregated_only=True, pp=[1, 2],
         prompt_tokens="2048:8192", output_tokens=128, engine="sglang"),
    dict(model_config="qwen3-30b-a3b", hw="h100-sxm", gpus=2, expert_parallel="on", pp=[1], slo_itl_p90_ms=1e-3,
         weights="fp8", compute="fp8", kv="fp8"),
]


def cli_args(case):
    return conftest.cli_args("plan", case, repeated=("schedule",))


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_same_document_as_the_cli(cli, case):
    case = SMALL | case
    assert lp.plan(**case).to_dict() == cli(*cli_args(case))


def row_doc(p):
    d = {"layout": p.layout, "disaggregated": p.disaggregated, "tp": p.tp, "instances": p.instances,
         "decode_tp": p.decode_tp, "decode_instances": p.decode_instances, "pp": p.pp,
         "expert_parallel": p.expert_parallel, "gpus": p.gpus, "max_batch_tokens": p.max_batch_tokens,
         "max_seqs": p.max_seqs, "method": p.method, "rate_per_s": p.rate,
         "output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
         "output_tokens_per_s_per_user": p.output_tokens_per_s_per_user,
         "ttft_p90_ms": p.metrics.ttft.p90 * 1e3, "itl_p90_ms": p.metrics.itl.p90 * 1e3,
         "meets_objectives": p.meets_objectives}
    if p.accuracy is not None:
        d["accuracy"] = p.accuracy
    if p.launch:
        d["launch"] = [{"engine": e, "command": c} for e, c in p.launch]
    return d


def test_points_are_the_documents(tmp_path):
    ev = {"model_name": "tiny", "results": [{"task": "qa", "length": 4096, "methods": [
        {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3", "samples": 20, "accuracy": 0.8,
         "accuracy_change": -0.05}]}]}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(ev))
    r = lp.plan(**SMALL, model_config="llama-3.1-8b", hw="h100-sxm", gpus=4, slo_ttft_p90_ms=1000, pp=[1],
                eval=str(path))
    d = r.to_dict()
    assert [row_doc(p) for p in r.frontier] == d["frontier"]
    assert r.best is not None and row_doc(r.best) == d["best"] and r.best_reachable is None
    assert r.layouts_searched == d["layouts_searched"] and r.simulations == d["simulations"]
    assert r.accuracy == d["accuracy"] and r.methods == ["none", "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3"]
    pruned = [p for p in r.points if p.method.startswith("lazyllm")]
    assert pruned and all(p.accuracy[0]["change"] == -0.05 for p in pruned)
    # A point per fitting layout and load (the simulations also count each layout's saturated run).
    assert len(r.points) == r.layouts_searched * len(SMALL["loads"]) and all(p.launch == [] for p in r.points)
    best = r.best
    assert best.meets_objectives and best.metrics.ttft.p90 <= 1.0
    assert all(p.output_tokens_per_s_per_gpu <= best.output_tokens_per_s_per_gpu for p in r.points
               if p.meets_objectives)


def test_an_unreachable_objective_gives_the_closest():
    r = lp.plan(**SMALL, model_config="llama-3.1-8b", hw="l4", gpus=1, slo_ttft_p90_ms=1e-3, pp=[1])
    assert r.best is None and r.best_reachable is not None and not r.best_reachable.meets_objectives
    assert r.best_reachable.launch and "best_reachable" in r.to_dict()


BAD = [
    (dict(gpus=0), "--gpus must be between 1 and 4096, got 0"),
    (dict(loads=[0.5, 2.0]), "--loads must be between 0.001 and 1, got 2"),
    (dict(requests=4), "--requests must be between 8 and 1048576, got 4"),
    (dict(memory_fraction=0.0), "--memory-fraction must be between 0.05 and 1, got 0"),
    (dict(batch_tokens=[0]), "--batch-tokens must be between 1 and 16777216, got 0"),
    (dict(max_layouts=1), None),
    (dict(hw="h100-sxm,l4"), "--hw names one profile for plan, got 2"),
]


@pytest.mark.parametrize("bad,message", BAD, ids=lambda x: str(x))
def test_bad_input_is_the_clis_error(cli, bad, message):
    case = SMALL | dict(model_config="llama-3.1-8b", hw="h100-sxm", gpus=2, pp=[1]) | bad
    with pytest.raises(lp.Error) as e:
        lp.plan(**case)
    assert cli_error(cli(*cli_args(case), expect_ok=False)) == str(e.value)
    if message is not None:
        assert str(e.value) == message


def test_wrong_types_are_type_errors():
    for kwargs in (dict(gpus="4"), dict(loads=0.5), dict(pp=[1.5]), dict(schedule=3), dict(nope=1)):
        with pytest.raises(TypeError):
            lp.plan(**(dict(model_config="llama-3.1-8b", hw="h100-sxm") | kwargs))
    with pytest.raises(lp.Error, match="--expert-parallel must be both, on or off"):
        lp.plan(model_config="llama-3.1-8b", hw="h100-sxm", expert_parallel="maybe")
