"""Every field of the CLI's JSON documents is an attribute of the typed results (in SI units where
the document has ms or MiB), equal to it: the objects carry what the documents carry."""
import math

import lazyprefill as lp

OP_FIELDS = {"time_ms": ("time_s", 1e3), "flop": ("flop", 1), "bytes": ("bytes", 1), "compute_ms": ("compute_s", 1e3),
             "memory_ms": ("memory_s", 1e3), "overhead_ms": ("overhead_s", 1e3), "calls": ("calls", 1)}


def check_ops(table, doc):
    names = lp.OpCosts.names
    assert set(doc) == {n for i, n in enumerate(names) if table.calls[i] > 0}
    for name, fields in doc.items():
        i = names.index(name)
        for key, (attr, scale) in OP_FIELDS.items():
            assert getattr(table, attr)[i] * scale == fields[key], (name, key)


def test_simulate():
    r = lp.simulate(model_config="llama-3.1-70b", hw="h100-sxm,h200", prune="lazyllm", prompt_tokens=8192,
                    new_tokens=5, tp=2, pp=2, pp_microbatches=2)
    d = r.to_dict()
    report = {"model": r.model, "n_layer": r.n_layer, "n_params": r.n_params, "config": r.config.to_dict(),
              "trace": r.trace, "policy": r.policy, "schedule": r.schedule, "prompt_tokens": r.prompt_tokens,
              "decode_steps": r.decode_steps, "revivals": r.revivals, "precision": r.precision, "tp": r.tp,
              "ep": r.ep, "dp": r.dp, "pp": r.pp, "pp_microbatches": r.pp_microbatches}
    assert set(d) == set(report) | {"results"}
    for k, v in report.items():
        assert d[k] == v, k
    for res, rd in zip(r.results, d["results"], strict=True):
        p, b = res.pruned, res.unpruned
        fields = {
            "hw": res.hw.name, "hw_description": res.hw.description, "engine": res.hw.engine,
            "efficiency_default": res.hw.efficiency_default, "ttft_ms": p.ttft_s * 1e3,
            "baseline_ttft_ms": b.ttft_s * 1e3, "ttft_speedup": res.ttft_speedup,
            "decode_step_ms": list(p.decode_step_s * 1e3), "decode_step_mean_ms": p.decode_step_mean_s * 1e3,
            "baseline_decode_step_mean_ms": b.decode_step_mean_s * 1e3, "total_ms": p.total_s * 1e3,
            "baseline_total_ms": b.total_s * 1e3, "total_speedup": res.total_speedup,
            "prefill_flop": p.prefill_flop, "baseline_prefill_flop": b.prefill_flop,
            "prefill_bound_op": p.prefill_bound_op, "prefill_comm_ms": p.prefill_comm_s * 1e3,
            "decode_comm_ms": p.decode_comm_s * 1e3, "pp": p.pp, "pp_microbatches": p.pp_microbatches,
            "prefill_pp_ms": p.prefill_pp_s * 1e3, "prefill_busy_ms": p.prefill_busy_s * 1e3,
            "decode_pp_ms": p.decode_pp_s * 1e3, "memory_bytes": p.memory.to_dict(),
            "baseline_memory_bytes": {"kv": b.memory.kv, "total": b.memory.total},
            "fits_in_memory": res.fits_in_memory}
        assert set(rd) == set(fields) | {"prefill_ops", "decode_ops"}
        for k, v in fields.items():
            assert rd[k] == v, k
        assert p.prefill_pp_s > 0 and p.pp == 2 and p.tp == 2
        check_ops(p.prefill_ops, rd["prefill_ops"])
        check_ops(p.decode_ops, rd["decode_ops"])


def metrics_doc(m):
    pct = lambda p: {"p50": p.p50 * 1e3, "p90": p.p90 * 1e3, "p99": p.p99 * 1e3, "mean": p.mean * 1e3}
    return {"requests": m.requests, "duration_s": m.duration_s, "requests_per_s": m.requests_per_s,
            "output_tokens_per_s": m.output_tokens_per_s, "prompt_tokens_per_s": m.prompt_tokens_per_s,
            "goodput_per_s": m.goodput_per_s, "ttft_ms": pct(m.ttft), "itl_ms": pct(m.itl), "e2e_ms": pct(m.e2e),
            "queue_ms": pct(m.queue), "kv_utilisation_mean": m.kv_utilisation_mean,
            "kv_utilisation_peak": m.kv_utilisation_peak, "prompt_share_mean": m.prompt_share_mean}


def test_simulate_serving():
    base = dict(model_config="llama-3.1-8b", requests=50, kv_budget_mib=3000, prompt_tokens=4096,
                slo_ttft_p90_ms=500)
    for case in (dict(hw="h100-sxm", disaggregate="1:1", rate=4),
                 dict(hw="h100-sxm,l4", kv_mode="on-demand", prefix_cache=True, shared_prefix="1024:2",
                      rate=[2, math.inf])):
        r = lp.simulate_serving(**base, **case)
        d = r.to_dict()
        report = {"tool": "lazyprefill simulate-serving", "model": r.model, "scheduler": r.scheduler,
                  "schedule": r.schedule, "revivals": r.revivals, "objectives": r.objectives,
                  "workload": r.workload}
        if r.schedulers is not None:
            report["schedulers"] = r.schedulers
        assert set(d) == set(report) | {"results"}
        for k, v in report.items():
            assert d[k] == v, k
        for run, rd in zip(r.runs, d["results"], strict=True):
            fields = {"hw": run.hw, "method": run.method,
                      "rate_per_s": "inf" if math.isinf(run.rate) else run.rate,
                      "metrics": metrics_doc(run.metrics), "iterations": run.iterations,
                      "kv_mib_over_time": {"columns": ["t_s", "reserved", "used"],
                                           "points": [[t, res / 2**20, used / 2**20] for t, res, used in run.kv]}}
            for opt in ("preemptions", "prompt_tokens_cached_share", "deployment", "handover"):
                if getattr(run, opt) is not None:
                    fields[opt] = getattr(run, opt)
            assert set(rd) == set(fields)
            for k, v in fields.items():
                assert rd[k] == v, k
    cap = lp.simulate_serving(**base, hw="h100-sxm", capacity=True, seeds=1, tolerance=0.1)
    for c, cd in zip(cap.capacities, cap.to_dict()["capacity"], strict=True):
        fields = {"hw": c.hw, "method": c.method, "met": c.met, "rate_per_s": c.rate, "rate_min_per_s": c.rate_min,
                  "rate_max_per_s": c.rate_max, "resolution": c.resolution, "simulations": c.simulations,
                  "at_rate" if c.met else "best_at_lowest_rate": metrics_doc(c.at_rate if c.met else
                                                                             c.best_at_lowest_rate)}
        assert cd == fields


def test_compare():
    r = lp.compare(model_config="llama-3.1-70b", hw="h100-sxm", devices=4, prompt_tokens=[8192, 65536],
                   kv_predict="llama-3.1-8b")
    d = r.to_dict()
    report = {"tool": "lazyprefill compare", "model": r.model, "hw": r.hw.name, "devices": r.devices,
              "combined_schedule": r.combined_schedule, "precision": r.precision,
              "memory_per_device_gib": r.hw.memory_capacity / 2**30,
              "kv_prediction_accuracy": r.kv_prediction_accuracy}
    if r.tp_refused:
        report["tp_refused"] = r.tp_refused
    assert set(d) == set(report) | {"prompts"}
    for k, v in report.items():
        assert d[k] == v, k
    for table, td in zip(r.tables, d["prompts"], strict=True):
        assert td["prompt_tokens"] == table.prompt_tokens
        for row, rd in zip(table.rows, td["methods"], strict=True):
            fields = {"method": row.method, "devices": row.devices, "accuracy": row.accuracy}
            if row.refused:
                fields["refused"] = row.note
            else:
                fields |= {"ttft_ms": row.ttft_s * 1e3, "speedup": row.speedup,
                           "memory_per_device_gib": row.memory_bytes / 2**30, "fits_in_memory": row.fits}
                if row.note:
                    fields["note"] = row.note
            assert rd == fields
