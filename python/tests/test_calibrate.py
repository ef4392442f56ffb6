"""lazyprefill.calibrate and calibrate_serving against the CLI's --json documents and written profiles,
the fitted Profile passed back to the simulator, the arrays' units, and the refusals in the CLI's words."""
import json
import math
import os
import re
import shutil

import numpy as np
import pytest

import lazyprefill as lp
from conftest import cli_error

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MEAS = os.path.join(ROOT, "tests", "fixtures", "measurements")
BENCH = os.path.join(ROOT, "tests", "fixtures", "serving-benchmarks")
RUNAHEAD = os.path.join(ROOT, "tests", "fixtures", "runahead")


def m(name):
    return os.path.join(MEAS, name)


def b(name):
    return os.path.join(BENCH, name)


def undated(doc):
    """The document with its dates (the calibration's day, in the record and the provenance) as DATE:
    two runs either side of midnight are the same calibration."""
    return json.loads(re.sub(r"\d{4}-\d{2}-\d{2}", "DATE", json.dumps(doc)))


def flags(case, repeated=("measurements", "hw_map", "model_map")):
    args = []
    for k, v in case.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, dict):
            for name, value in v.items():
                args += [flag, f"{name}={value}"]
        elif isinstance(v, list) and k in repeated:
            args += [flag, *v]
        elif isinstance(v, list):
            args += [flag, ",".join(v)]
        else:
            args += [flag, v]
    return args


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """The single-process run --json outputs of the KV-Runahead fixtures: a --runs folder."""
    d = tmp_path_factory.mktemp("runs")
    for f in sorted(os.listdir(RUNAHEAD)):
        if f.startswith("single-"):
            shutil.copy(os.path.join(RUNAHEAD, f), d / f)
    return str(d)


CASES = [
    dict(base="h100-sxm", measurements=[m("vllm-latency-h100.json"), m("lazyprefill-h100.csv")], engine="vllm"),
    dict(base="h100-sxm", measurements=[m("lazyprefill-h100.csv")], engine="lazyprefill", name="h100-mine",
         fit=["gemm.compute", "overhead_us"]),
    dict(base="cpu-local", measurements=[m("llama-bench-smollm2-135m-epyc.json"),
                                         m("llama-bench-smollm2-135m-epyc-2.json")],
         hw_map={"AMD EPYC": "cpu-local"}),
    dict(base="h100-sxm", measurements=[m("trtllm-v0.5-first-token.csv")],
         hw_map={"A100": "a100-80gb", "H100": "h100-sxm"}, weights="fp8", compute="fp8", kv="fp8"),
    dict(base="a100-80gb", measurements=[m("trtllm-v0.5-first-token.csv")],
         hw_map=["A100=a100-80gb", "H100=h100-sxm"], fit="gemm.compute"),
]


def ids(case):
    return ",".join(f"{k}={os.path.basename(str(v))}" for k, v in case.items())


# The first case searches every candidate parameter (stepwise, with leave-one-out refits): about a
# second each for the CLI and the module, the one full search of the file; the others name theirs.
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_measurements_same_document_and_profile_as_the_cli(cli, tmp_path, case):
    cli_out, py_out = str(tmp_path / "cli.json"), str(tmp_path / "py.json")
    want = cli("calibrate", "--json", "--out", cli_out, *flags(case))
    r = lp.calibrate(out=py_out, **case)
    got = r.to_dict()
    assert got["profile"] == py_out and want["profile"] == cli_out
    got["profile"] = want["profile"] = None
    assert undated(got) == undated(want)
    with open(cli_out) as f, open(py_out) as g:
        assert undated(json.load(g)) == undated(json.load(f))
    assert undated(r.profile.to_dict()) == undated(json.load(open(cli_out)))
    if "engine" in case:
        assert r.base.engine == r.profile.engine == case["engine"]


def test_runs_same_document_and_profile_as_the_cli(cli, tmp_path, runs_dir):
    cli_out, py_out = str(tmp_path / "cli.json"), str(tmp_path / "py.json")
    want = cli("calibrate", "--json", "--runs", runs_dir, "--base", "cpu-local", "--name", "mine", "--out", cli_out)
    r = lp.calibrate(runs=runs_dir, base="cpu-local", name="mine", out=py_out)
    got = r.to_dict()
    got["profile"] = want["profile"] = None
    assert got == want
    assert undated(json.load(open(py_out))) == undated(json.load(open(cli_out)))
    assert r.source == "runs" and r.profile.name == "mine"
    # The end-to-end fit's figures do not exist for the per-op fit: NaNs and None, not zeros.
    assert all(math.isnan(x) for x in r.ttft_mape + r.decode_mape) and r.cross_validation is None
    assert r.points == [] and r.fit_s.shape == (0,)
    # The arrays are the document's runs, in seconds.
    assert r.runs == [x["run"] for x in want["runs"]]
    assert np.allclose(r.measured_s * 1e3, [x["measured_ms"] for x in want["runs"]], rtol=1e-12)
    assert np.allclose(r.predicted_s * 1e3, [x["predicted_ms"] for x in want["runs"]], rtol=1e-12)
    assert [f.family for f in r.families] == [x["family"] for x in want["families"]]
    assert all(f.optimizer == x["optimizer"] and f.samples == x["samples"]
               for f, x in zip(r.families, want["families"]))


def test_the_fitted_profile_simulates_as_its_file(cli, tmp_path):
    out = str(tmp_path / "fitted.json")
    r = lp.calibrate(base="h100-sxm", measurements=m("lazyprefill-h100.csv"), fit="gemm.compute", out=out)
    sim = dict(model_config="llama-3.1-8b", prompt_tokens=8192)
    want = cli("simulate", "--json", "--hw", out, "--model-config", "llama-3.1-8b", "--prompt-tokens", 8192)
    assert lp.simulate(hw=r.profile, **sim).to_dict() == want
    # Unwritten, the same profile: nothing on disk, the document's place null.
    unwritten = lp.calibrate(base="h100-sxm", measurements=m("lazyprefill-h100.csv"), fit="gemm.compute")
    assert unwritten.out is None and unwritten.to_dict()["profile"] is None
    assert undated(unwritten.profile.to_dict()) == undated(r.profile.to_dict())


def test_measurement_arrays_and_checks_are_the_documents():
    r = lp.calibrate(**CASES[2])
    d = r.to_dict()
    n = len(d["points"])
    assert r.source == "measurements" and len(r.points) == n
    for name, key in [("measured_s", "measured_ms"), ("base_s", "base_ms"), ("fit_s", "fit_ms"),
                      ("held_out_s", "held_out_ms")]:
        a = getattr(r, name)
        assert a.shape == (n,) and a.dtype == np.float64
        assert np.allclose(a * 1e3, [p[key] for p in d["points"]], rtol=1e-12), name
    for p, q in zip(r.points, d["points"]):
        assert (p.file, p.record, p.preset, p.quantity, p.tp) == (q["file"], q["record"], q["preset"],
                                                                  q["quantity"], q["tp"])
    assert [c.name for c in r.parameters] == [c["name"] for c in d["parameters"]]
    assert r.fitted_parameters == [f["name"] for f in d["calibration"]["fitted"]]
    for c, q in zip(r.parameters, d["parameters"]):
        assert c.fitted == q["fitted"] and c.relative_error == q["relative_error"]
    mape = d["calibration"]["ttft_mape_pct"]
    assert r.ttft_mape == pytest.approx((mape["base"] / 100, mape["fit"] / 100, mape["held_out"] / 100), rel=1e-12)
    assert r.cross_validation == d["calibration"]["cross_validation"]


SERVING = [
    dict(benchmark=[b("vllm-rate2.json"), b("vllm-rate4.json"), b("vllm-conc8.json")],
         model_config="smollm2-135m", hw="cpu-local", weights="5bpw", compute="int8", kv="f16", kv_budget_mib=1024),
    dict(benchmark=[b("vllm-rate2.json"), b("aiperf-conc4.json")], model_config="smollm2-135m", hw="cpu-local",
         weights="5bpw", compute="int8", kv="f16", kv_budget_mib=1024, fit="scale,iteration,request"),
    dict(benchmark=[b("guidellm-poisson3.json")], model_config="smollm2-135m", hw="cpu-local", weights="5bpw",
         compute="int8", kv="f16", seed=3, engine="vllm", max_seqs=64, iteration_overhead_ms=0.5),
]


@pytest.mark.parametrize("case", SERVING, ids=ids)
def test_serving_same_document_and_profile_as_the_cli(cli, tmp_path, case):
    cli_out, py_out = str(tmp_path / "cli.json"), str(tmp_path / "py.json")
    want = cli("calibrate-serving", "--json", "--out", cli_out, *serving_flags(case))
    r = lp.calibrate_serving(out=py_out, **case)
    got = r.to_dict()
    assert got.pop("profile") == py_out and want.pop("profile") == cli_out
    assert got == want
    assert json.load(open(py_out)) == json.load(open(cli_out))
    assert r.profile.to_dict() == json.load(open(cli_out))


def serving_flags(case):
    args = []
    for k, v in case.items():
        flag = "--" + k.replace("_", "-")
        if k == "benchmark":
            for x in v:
                args += [flag, x]
        else:
            args += [flag, v]
    return args


def test_serving_arrays_in_seconds_and_shares():
    case = SERVING[0]
    r = lp.calibrate_serving(**case)
    d = r.to_dict()
    n, k = len(d["points"]), len(r.figures)
    assert r.figures == list(d["mape_percent"]) and r.benchmarks == [p["benchmark"] for p in d["points"]]
    for name in ("measured", "uncalibrated", "calibrated", "held_out"):
        a = getattr(r, name)
        assert a.shape == (n, k)
        for i, p in enumerate(d["points"]):
            for j, fig in enumerate(r.figures):
                doc = p["figures"][fig][name]
                scale = 1 if fig == "output_tokens_per_s" else 1e3  # the document's ms
                assert (doc is None and math.isnan(a[i, j])) or a[i, j] * scale == pytest.approx(doc, rel=1e-12)
    for j, fig in enumerate(r.figures):
        for name in ("uncalibrated", "calibrated", "held_out"):
            doc = d["mape_percent"][fig][name]
            a = getattr(r, "mape_" + name)[j]
            assert (doc is None and math.isnan(a)) or a * 100 == pytest.approx(doc, rel=1e-12)
    assert r.kernel_scale == d["fitted"]["kernel_scale"]
    assert r.iteration_overhead_s * 1e3 == pytest.approx(d["fitted"]["iteration_overhead_ms"], rel=1e-12)
    assert r.out is None and "profile" not in d
    assert r.profile.to_dict()["engine"]["kernel_scale"] == r.kernel_scale
    # The fitted engine carries into a serving simulation.
    s = lp.simulate_serving(hw=r.profile, model_config="smollm2-135m", weights="5bpw", compute="int8", kv="f16",
                            prune="none", rate=2, requests=20, kv_budget_mib=1024)
    assert s.runs[0].metrics.requests == 20


BAD = [
    (dict(base="h100-sxm"), ["calibrate", "--base", "h100-sxm", "--out", "{out}"]),
    (dict(base="no-such-gpu", measurements=m("plain.csv")),
     ["calibrate", "--base", "no-such-gpu", "--measurements", m("plain.csv"), "--out", "{out}"]),
    (dict(base="a100-80gb", measurements=m("plain.csv"), model_map=["oops"]),
     ["calibrate", "--base", "a100-80gb", "--measurements", m("plain.csv"), "--model-map", "oops", "--out", "{out}"]),
    (dict(base="a100-80gb", measurements=m("plain.csv"), fit="gemm.bogus"),
     ["calibrate", "--base", "a100-80gb", "--measurements", m("plain.csv"), "--fit", "gemm.bogus", "--out", "{out}"]),
    (dict(base="a100-80gb", measurements=m("no-such-file.csv")),
     ["calibrate", "--base", "a100-80gb", "--measurements", m("no-such-file.csv"), "--out", "{out}"]),
    (dict(base="a100-80gb", runs="/no/such/folder"),
     ["calibrate", "--base", "a100-80gb", "--runs", "/no/such/folder", "--out", "{out}"]),
    (dict(benchmark=b("vllm-rate2.json"), model_config="smollm2-135m", hw="cpu-local", tp=0),
     ["calibrate-serving", "--benchmark", b("vllm-rate2.json"), "--model-config", "smollm2-135m", "--hw",
      "cpu-local", "--tp", "0"]),
    (dict(benchmark=b("vllm-rate2.json"), model_config="smollm2-135m", hw="cpu-local", kv_fraction=float("nan")),
     ["calibrate-serving", "--benchmark", b("vllm-rate2.json"), "--model-config", "smollm2-135m", "--hw",
      "cpu-local", "--kv-fraction", "nan"]),
    (dict(benchmark=b("vllm-rate2.json"), model_config="smollm2-135m", hw="cpu-local", kv_budget_mib=-1),
     ["calibrate-serving", "--benchmark", b("vllm-rate2.json"), "--model-config", "smollm2-135m", "--hw",
      "cpu-local", "--kv-budget-mib", "-1"]),
    (dict(benchmark=b("vllm-rate2.json"), model_config="smollm2-135m", hw="cpu-local", fit="scale,bogus"),
     ["calibrate-serving", "--benchmark", b("vllm-rate2.json"), "--model-config", "smollm2-135m", "--hw",
      "cpu-local", "--fit", "scale,bogus"]),
    (dict(benchmark=m("plain.csv"), model_config="smollm2-135m", hw="cpu-local"),
     ["calibrate-serving", "--benchmark", m("plain.csv"), "--model-config", "smollm2-135m", "--hw", "cpu-local"]),
]


@pytest.mark.parametrize("case,argv", BAD, ids=lambda x: ids(x) if isinstance(x, dict) else "")
def test_refusals_carry_the_clis_line(cli, tmp_path, case, argv):
    out = str(tmp_path / "never.json")
    p = cli(*[a.replace("{out}", out) for a in argv], expect_ok=False)
    call = lp.calibrate_serving if argv[0] == "calibrate-serving" else lp.calibrate
    with pytest.raises(lp.Error) as e:
        call(**case, out=out)
    assert str(e.value) == cli_error(p)
    assert isinstance(e.value, ValueError)
    assert not os.path.exists(out)


def test_an_output_over_an_input_is_refused_and_the_input_kept(tmp_path):
    src = tmp_path / "plain.csv"
    shutil.copy(m("plain.csv"), src)
    before = src.read_bytes()
    with pytest.raises(lp.Error, match="--out"):
        lp.calibrate(base="a100-80gb", measurements=str(src), out=str(src))
    assert src.read_bytes() == before


def test_wrong_types_and_unknown_keywords_are_type_errors():
    with pytest.raises(TypeError):
        lp.calibrate(base=3, measurements=m("plain.csv"))
    with pytest.raises(TypeError):
        lp.calibrate(base="a100-80gb", measurements=5)
    with pytest.raises(TypeError):
        lp.calibrate(base="a100-80gb", measurements=m("plain.csv"), hw_map={"A100": 1})
    with pytest.raises(TypeError):
        lp.calibrate(base="a100-80gb", measurements=m("plain.csv"), bogus=1)
    with pytest.raises(TypeError):
        lp.calibrate_serving(benchmark=b("vllm-rate2.json"), model_config="smollm2-135m", hw="cpu-local", tp="2")
    with pytest.raises(TypeError):
        lp.calibrate_serving(benchmark=b("vllm-rate2.json"), model_config="smollm2-135m", hw=None)


def test_a_base_profile_object_and_options_that_need_measurements(runs_dir):
    base = lp.Profile.load("h100-sxm").replace(memory_bandwidth_gbs=3000)
    r = lp.calibrate(base=base, measurements=m("lazyprefill-h100.csv"), fit="gemm.compute")
    assert r.to_dict()["calibration"]["base"] == base.name
    assert r.profile.memory_bandwidth == pytest.approx(3000e9)
    with pytest.raises(lp.Error, match="--fit applies to --measurements"):
        lp.calibrate(base="cpu-local", runs=runs_dir, fit="gemm.compute")
    with pytest.raises(lp.Error, match="not both"):
        lp.calibrate(base="cpu-local", runs=runs_dir, measurements=m("plain.csv"))
