"""lazyprefill.report against `lazyprefill report --json`, its folder, its arrays, its refusals."""
import json
import math

import numpy as np
import pytest

import lazyprefill as lp
import conftest
from conftest import cli_error

CASE = dict(model_config="llama-3.1-8b", hw=["h100-sxm", "l4"], prompt_lengths=[1024, 8192, 32768],
            prune="lazyllm,static-paper", slo_ttft_ms=500, mem_budget_gib=20, new_tokens=4)


def cli_args(case, out):
    case = dict(case)
    if isinstance(case.get("hw"), list):
        case["hw"] = ",".join(case["hw"])
    return conftest.cli_args("report", case, repeated=("schedule",)) + ["--out", out]


def without_time(d):
    """The document without when and from which commit it was built (a module rebuilt alone may be a
    commit ahead of the CLI)."""
    d = json.loads(json.dumps(d))
    d["provenance"].pop("generated_utc")
    d["provenance"].pop("git_commit")
    return d


def test_same_document_and_folder_as_the_cli(cli, tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "cli"
    r = lp.report(**CASE, out=str(mine))
    doc = cli(*cli_args(CASE, str(theirs)))
    assert without_time(r.to_dict()) == without_time(doc)
    for f in ("capacity-report.json", "report.html"):
        assert (mine / f).is_file() and (theirs / f).is_file()
    assert sorted(p.name for p in mine.iterdir()) == sorted(p.name for p in theirs.iterdir())
    assert without_time(json.loads((mine / "capacity-report.json").read_text())) == without_time(doc)


def test_serving_capacity_and_a_moe_layout(cli, tmp_path):
    case = dict(model_config="qwen3-30b-a3b", hw="h100-sxm", prompt_lengths=[4096], tp=2, ep=2, prune="lazyllm",
                serving_slo_ttft_p90_ms=1000, serving_requests=60, serving_prompt_tokens="2048:4096")
    r = lp.report(**case)
    assert without_time(r.to_dict()) == without_time(cli(*cli_args(case, str(tmp_path / "cli"))))
    assert r.to_dict()["serving"] is not None


def test_arrays_are_the_documents_cells():
    r = lp.report(**CASE)
    d = r.to_dict()
    H, M, L = len(r.hardware), len(r.methods), len(r.prompt_lengths)
    assert (H, L) == (2, 3) and r.methods[0] == "none" and r.ttft_s.shape == (H, M, L)
    cells = iter(d["results"])  # hardware-major, then method, then length
    for h in range(H):
        for m in range(M):
            for l in range(L):
                c = next(cells)
                assert (c["hw"], c["method"], c["prompt_tokens"]) == (r.hardware[h], r.methods[m], r.prompt_lengths[l])
                assert r.ttft_s[h, m, l] == pytest.approx(c["ttft_ms"] * 1e-3, rel=1e-15)
                assert r.speedup[h, m, l] == c["speedup"] and r.prefill_flop[h, m, l] == c["prefill_flop"]
                assert r.memory_bytes[h, m, l] == c["memory_bytes"]["total"]
                assert r.fits_in_memory[h, m, l] == float(c["fits_in_memory"])
    assert np.all(r.speedup[:, 0, :] == 1)  # the baseline
    caps = {(c["hw"], c["method"]): c["max_prompt_tokens_within_slo"] for c in d["capacity"]}
    for h in range(H):
        for m in range(M):
            want = caps[(r.hardware[h], r.methods[m])]
            got = r.max_prompt_tokens_within_slo[h, m]
            assert (math.isnan(got) and want is None) or got == want
    assert "ttft" in r.summary().lower()


BAD = [
    (dict(slo_ttft_ms=math.nan), "--slo-ttft-ms must be a positive number, got nan"),
    (dict(slo_ttft_ms=0.0), "--slo-ttft-ms must be a positive number, got 0"),
    (dict(mem_budget_gib=-1.0), "--mem-budget-gib must be a positive number, got -1"),
    (dict(tp=0), "--tp must be between 1 and 4096, got 0"),
    (dict(batch=0), "--batch must be between 1 and 4096, got 0"),
    (dict(serving_slo_ttft_p90_ms=100, serving_requests=5), "--serving-requests must be between 10 and 4194304, got 5"),
    (dict(hw="h999"), None),
]


@pytest.mark.parametrize("bad,message", BAD, ids=lambda x: str(x))
def test_bad_input_is_the_clis_error(cli, tmp_path, bad, message):
    case = dict(model_config="llama-3.1-8b", hw="h100-sxm", prompt_lengths=[1024]) | bad
    with pytest.raises(lp.Error) as e:
        lp.report(**case, out=str(tmp_path / "mine"))
    assert cli_error(cli(*cli_args(case, str(tmp_path / "cli")), expect_ok=False)) == str(e.value)
    if message is not None:
        assert str(e.value) == message
    assert not (tmp_path / "mine").exists() and not (tmp_path / "cli").exists()


def test_a_bad_validation_file_is_refused_before_anything_is_written(tmp_path):
    bad = tmp_path / "validation.json"
    bad.write_text("[1, 2]")
    with pytest.raises(lp.Error, match="validation"):
        lp.report(model_config="llama-3.1-8b", hw="h100-sxm", prompt_lengths=[1024], out=str(tmp_path / "out"),
                  validation=str(bad))
    assert not (tmp_path / "out").exists()
    with pytest.raises(lp.Error, match="prompt-lengths"):
        lp.report(model_config="llama-3.1-8b", hw="h100-sxm", prompt_lengths=[0])
    with pytest.raises(TypeError):
        lp.report(model_config="llama-3.1-8b", hw="h100-sxm", prompt_lengths="1024")
    with pytest.raises(TypeError):
        lp.report(model_config="llama-3.1-8b", hw="h100-sxm")  # prompt_lengths is required, as on the CLI
