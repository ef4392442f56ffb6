// lazyprefill._core: the Python module's bindings (nanobind) over the rooms the CLI's simulator
// commands call. No logic lives here: each function fills the library's request from keyword
// arguments whose defaults are the request's own, calls the library, and hands back its typed
// result. Units are the library's (seconds, bytes, FLOP); to_dict()/to_json() give the CLI's JSON
// documents (milliseconds where the CLI prints them). docs/python.md.
#include <fmt/ranges.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "convert.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "reports/plan_study.h"
#include "reports/report_study.h"
#include "sim/compare.h"
#include "sim/cost.h"
#include "sim/kv_predict.h"
#include "sim/replay.h"
#include "sim/serving_study.h"
#include "sim/simulate.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lp::py {

using json = nlohmann::ordered_json;

json from_python(const nb::handle& v, const std::string& what) {
  nb::object dumps = nb::module_::import_("json").attr("dumps");
  std::string text;
  try {
    text = nb::cast<std::string>(dumps(v, "allow_nan"_a = false));
  } catch (const nb::python_error& e) {
    usage_fail("{}: not a JSON document: {}", what, e.what());
  }
  return json_parse<json>(text, what);  // depth-checked, as every JSON input is
}

nb::object to_python(const json& j) {
  return nb::module_::import_("json").attr("loads")(json_text(j, -1));
}
nb::object to_python(const nlohmann::json& j) {
  return nb::module_::import_("json").attr("loads")(json_text(j, -1));
}

std::vector<std::string> strings_from(const nb::handle& h, const char* what) {
  if (h.is_none()) return {};
  if (nb::isinstance<nb::str>(h)) return {nb::cast<std::string>(h)};
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    std::vector<std::string> out;
    for (nb::handle x : h) {
      if (!nb::isinstance<nb::str>(x))
        throw nb::type_error(fmt::format("{}: expected a string or a list of them", what).c_str());
      out.push_back(nb::cast<std::string>(x));
    }
    return out;
  }
  throw nb::type_error(fmt::format("{}: expected a string or a list of them", what).c_str());
}

namespace {

// Per-op costs as arrays over the ops (op_name order), one row per layer for a table of layers.
struct OpTable {
  std::vector<sim::OpCosts> rows;
  bool layered = false;  // [layers, ops] arrays; else [ops]
  template <class F>
  nb::object column(F f) const {
    std::vector<double> out;
    out.reserve(rows.size() * size_t(kNumOps));
    for (const sim::OpCosts& r : rows)
      for (const sim::OpCost& o : r) out.push_back(double(f(o)));
    return layered ? to_numpy(std::move(out), {rows.size(), size_t(kNumOps)})
                   : to_numpy(std::move(out), {size_t(kNumOps)});
  }
};

std::vector<std::string> op_names() {
  std::vector<std::string> out;
  for (int i = 0; i < kNumOps; ++i) out.emplace_back(op_name(Op(i)));
  return out;
}

// The hardware argument: a name, a comma-separated list (the CLI's --hw), a Profile, or a list of
// names and Profiles; `engine` replaces each profile's engine as --engine does.
std::vector<hw::Profile> profiles_from(const nb::handle& h, const std::optional<std::string>& engine) {
  std::vector<hw::Profile> out;
  const auto add = [&](const nb::handle& x) {
    if (nb::isinstance<hw::Profile>(x))
      out.push_back(nb::cast<hw::Profile>(x));
    else if (nb::isinstance<nb::str>(x)) {
      for (const std::string& name : split_list(nb::cast<std::string>(x)))
        out.push_back(hw::load_profile(name));
    } else
      throw nb::type_error("hw: expected a profile name, a Profile, or a list of them");
  };
  if (nb::isinstance<nb::str>(h) || nb::isinstance<hw::Profile>(h))
    add(h);
  else if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h))
    for (nb::handle x : h) add(x);
  else
    throw nb::type_error("hw: expected a profile name, a Profile, or a list of them");
  if (engine)
    for (hw::Profile& p : out) p.engine = hw::engine_preset(*engine);
  if (out.empty()) usage_fail("--hw names no hardware profile");
  return out;
}

std::string replaced_origin(const std::string& name) {
  return name + " (replaced)";
}

// A length argument as the CLI takes it: a number of tokens, or a LengthDist spec ("4096:8192",
// "normal:2048:512", "file:PATH").
std::string length_spec(const nb::handle& h, const char* what) {
  if (nb::isinstance<nb::str>(h)) return nb::cast<std::string>(h);
  if (nb::isinstance<nb::int_>(h) && !nb::isinstance<nb::bool_>(h))
    return std::to_string(nb::cast<int64_t>(h));
  throw nb::type_error(fmt::format("{}: expected a number of tokens or a length spec (str)", what).c_str());
}

// The arrival rates: a number (inf: all at once), or a list of them; None: the default.
std::vector<double> rates_from(const nb::handle& h) {
  std::vector<double> out;
  const auto one = [&](const nb::handle& x) {
    if (!(nb::isinstance<nb::float_>(x) || nb::isinstance<nb::int_>(x)) || nb::isinstance<nb::bool_>(x))
      throw nb::type_error("rate: expected a number of requests/s or a list of them");
    out.push_back(nb::cast<double>(x));
  };
  if (h.is_none()) return out;
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h))
    for (nb::handle x : h) one(x);
  else
    one(h);
  return out;
}

// A number of tokens or a list of them (the CLI's comma lists).
std::vector<int64_t> ints_from(const nb::handle& h, const char* what) {
  std::vector<int64_t> out;
  const auto one = [&](const nb::handle& x) {
    if (!nb::isinstance<nb::int_>(x) || nb::isinstance<nb::bool_>(x))
      throw nb::type_error(fmt::format("{}: expected a whole number or a list of them", what).c_str());
    out.push_back(nb::cast<int64_t>(x));
  };
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h))
    for (nb::handle x : h) one(x);
  else
    one(h);
  return out;
}

// A precision as its JSON has it.
nb::dict precision_dict(const sim::Precision& p) {
  nb::dict d;
  d["weights"] = p.weights;
  d["compute"] = p.compute;
  d["kv"] = p.kv;
  return d;
}

// A point of a plan as its document has it (plan's point_json), typed.
struct PlanRow {
  std::string layout, method;
  bool disaggregated = false, expert_parallel = false, meets = false;
  int tp = 1, instances = 1, decode_tp = 0, decode_instances = 0, pp = 1, gpus = 1;
  int64_t max_batch_tokens = 0, max_seqs = 0;
  double rate = 0, per_gpu = 0, per_user = 0;
  sim::ServingMetrics metrics;
  nlohmann::json accuracy;                                  // null where the method does not prune
  std::vector<std::pair<std::string, std::string>> launch;  // with_launch
};

PlanRow plan_row(const report::PlanReport& r, size_t i, bool with_launch) {
  const sim::PlanPoint& pt = r.result.points[i];
  const sim::Layout& l = r.result.layouts[pt.layout];
  PlanRow row;
  row.layout = l.describe();
  row.method = r.options.methods[l.method].name;
  row.disaggregated = l.disaggregated();
  row.expert_parallel = l.ep;
  row.meets = pt.meets;
  row.tp = l.tp, row.instances = l.replicas, row.decode_tp = l.decode_tp,
  row.decode_instances = l.decode_instances;
  row.pp = l.pp, row.gpus = l.gpus();
  row.max_batch_tokens = l.max_batch_tokens, row.max_seqs = l.max_seqs;
  row.rate = pt.rate, row.per_gpu = pt.tokens_per_s_per_gpu, row.per_user = pt.tokens_per_s_per_user;
  row.metrics = pt.metrics;
  const nlohmann::ordered_json j = r.point_json(i);
  if (j.contains("accuracy")) row.accuracy = j["accuracy"];
  if (with_launch)
    for (const sim::LaunchConfig& lc : r.launch(i)) row.launch.emplace_back(lc.engine, lc.command);
  return row;
}

// A per-case quantity of a report as [hardware, method, prompt length].
template <class F>
nb::object cells(const report::Report& r, F f) {
  const size_t H = r.provenance.hardware.size(), M = r.provenance.methods.size(), L = r.prompt_lengths.size();
  std::vector<double> v(H * M * L);
  for (size_t h = 0; h < H; ++h)
    for (size_t mm = 0; mm < M; ++mm)
      for (size_t l = 0; l < L; ++l) v[(h * M + mm) * L + l] = double(f(r.result(h, mm, l)));
  return to_numpy(std::move(v), {H, M, L});
}

// Report.write: the folder as `report --out` writes it, the inputs read first.
size_t write_report(const report::Report& rep, const std::string& out,
                    const std::optional<std::string>& validation, const std::optional<std::string>& plan) {
  const nlohmann::json v = report::read_validation(validation.value_or(""));
  const std::optional<report::PlanSummary> p = report::read_plan_file(plan.value_or(""));
  return report::write_report_folder(out, rep, v, p, {validation.value_or(""), plan.value_or("")});
}

// Per-request arrays (keep_requests): each field of RequestOutcome over the run's requests.
nb::dict request_arrays(const std::vector<sim::RequestOutcome>& reqs) {
  nb::dict d;
  const auto col = [&](const char* name, auto f) {
    std::vector<double> v;
    v.reserve(reqs.size());
    for (const sim::RequestOutcome& o : reqs) v.push_back(double(f(o)));
    d[name] = to_numpy(std::move(v), {reqs.size()});
  };
  col("arrival_s", [](const sim::RequestOutcome& o) { return o.arrival_s; });
  col("admitted_s", [](const sim::RequestOutcome& o) { return o.admitted_s; });
  col("first_token_s", [](const sim::RequestOutcome& o) { return o.first_token_s; });
  col("finished_s", [](const sim::RequestOutcome& o) { return o.finished_s; });
  col("ttft_s", [](const sim::RequestOutcome& o) { return o.ttft_s(); });
  col("itl_s", [](const sim::RequestOutcome& o) { return o.itl_s(); });
  col("prompt_tokens", [](const sim::RequestOutcome& o) { return o.prompt_tokens; });
  col("output_tokens", [](const sim::RequestOutcome& o) { return o.output_tokens; });
  col("cached_tokens", [](const sim::RequestOutcome& o) { return o.cached_tokens; });
  col("prompt_tokens_computed_fraction",
      [](const sim::RequestOutcome& o) { return o.prompt_tokens_computed_fraction; });
  return d;
}

}  // namespace
}  // namespace lp::py

NB_MODULE(_core, m) {
  using namespace lp;
  using namespace lp::py;
  m.doc() = "lazyprefill's simulator, planner and reports (docs/python.md)";
  m.attr("__version__") = LP_VERSION;

  // lp::Error (bad input: a flag's value, a file, a field) is a ValueError carrying the CLI's line;
  // an internal error (a bug of ours) a RuntimeError.
  nb::exception<lp::Error>(m, "Error", PyExc_ValueError);
  nb::exception<lp::InternalError>(m, "InternalError", PyExc_RuntimeError);

  // ---- hardware profiles
  nb::class_<hw::Profile>(
      m, "Profile",
      "A hardware profile (hwmodels/README.md): peaks, bandwidth, memory, efficiencies, engine. "
      "Attributes in SI units (FLOP/s, bytes/s, bytes, s).")
      .def_static("names", &hw::builtin_profile_names, "The built-in profiles' names.")
      .def_static("load", &hw::load_profile, "name_or_path"_a,
                  "A built-in profile by name, or a profile file (a path, or a name ending in .json).")
      .def_static(
          "from_dict",
          [](const nb::dict& d, const std::string& origin) {
            return hw::parse_profile(from_python(d, origin), origin);
          },
          "document"_a, "origin"_a = "profile dict",
          "A profile from its file document (the keys and units of hwmodels/*.json), validated as a file is.")
      .def(
          "to_dict", [](const hw::Profile& p) { return to_python(p.json); },
          "The profile's file document (hwmodels/README.md's keys and units).")
      .def(
          "to_json", [](const hw::Profile& p, int indent) { return json_text(p.json, indent); },
          "indent"_a = 2)
      .def(
          "replace",
          [](const hw::Profile& p, const nb::kwargs& fields) {
            json doc = p.json;
            for (auto [k, v] : fields) {
              const std::string key = nb::cast<std::string>(k);
              if (!doc.contains(key))
                usage_fail(
                    "Profile.replace: '{}' is not a field of {}'s document (to add an optional field, edit "
                    "to_dict() and pass it to Profile.from_dict)",
                    key, p.name);
              doc[key] = from_python(v, key);
            }
            hw::Profile out = hw::parse_profile(doc, replaced_origin(p.name));
            out.engine = p.engine;
            return out;
          },
          "A copy with top-level fields of its document replaced (memory_bandwidth_gbs=..., "
          "peak_tflops={...}), validated as a file is.")
      .def_prop_ro("name", [](const hw::Profile& p) { return p.name; })
      .def_prop_ro("description", [](const hw::Profile& p) { return p.description; })
      .def_prop_ro(
          "kind", [](const hw::Profile& p) { return p.kind; }, "'gpu' or 'cpu'")
      .def_prop_ro("aliases", [](const hw::Profile& p) { return p.aliases; })
      .def_prop_ro(
          "peak_flops", [](const hw::Profile& p) { return p.peak_flops; }, "dtype -> FLOP/s")
      .def_prop_ro(
          "memory_bandwidth", [](const hw::Profile& p) { return p.memory_bandwidth; }, "bytes/s")
      .def_prop_ro(
          "memory_capacity", [](const hw::Profile& p) { return p.memory_capacity; }, "bytes")
      .def_prop_ro(
          "onchip_cache", [](const hw::Profile& p) { return p.onchip_cache; }, "bytes")
      .def_prop_ro("compute_units", [](const hw::Profile& p) { return p.compute_units; })
      .def_prop_ro(
          "dispatch_overhead", [](const hw::Profile& p) { return p.dispatch_overhead; }, "s")
      .def_prop_ro(
          "interconnect_bandwidth", [](const hw::Profile& p) { return p.interconnect_bandwidth; }, "bytes/s")
      .def_prop_ro("max_tp", [](const hw::Profile& p) { return p.max_tp; })
      .def_prop_ro("engine", [](const hw::Profile& p) { return p.engine.name; })
      .def_prop_ro("efficiency_default", [](const hw::Profile& p) { return p.efficiency_default; })
      .def(
          "with_engine",
          [](const hw::Profile& p, const std::string& engine) {
            hw::Profile out = p;
            out.engine = hw::engine_preset(engine);
            return out;
          },
          "engine"_a, "A copy whose serving engine is a preset (the CLI's --engine).")
      .def("__repr__", [](const hw::Profile& p) { return "Profile('" + p.name + "')"; });
  m.def("engine_names", &hw::engine_names, "The serving engines' presets (the CLI's --engine).");

  // ---- model configurations
  nb::class_<ModelConfig>(
      m, "Model",
      "A model's configuration: a preset (model/presets.json), a GGUF file's shape or a dict "
      "with the presets' keys.")
      .def_static("names", &preset_names, "The presets' names.")
      .def_static("preset", &preset_config, "name_or_path"_a,
                  "A preset by name, or a configuration file (a path, or a name ending in .json).")
      .def_static(
          "from_gguf", [](const std::string& path) { return costing_config_from_gguf(GgufFile::open(path)); },
          "path"_a, "The shape of a GGUF file, as simulate --model costs it.")
      .def_static(
          "from_dict",
          [](const nb::dict& d, const std::string& origin) {
            return config_from_json(nlohmann::json(from_python(d, origin)), origin);
          },
          "document"_a, "origin"_a = "model dict",
          "A configuration from the presets' keys, validated as a preset is.")
      .def("to_dict", [](const ModelConfig& c) { return to_python(config_to_json(c)); })
      .def(
          "to_json", [](const ModelConfig& c, int indent) { return json_text(config_to_json(c), indent); },
          "indent"_a = 2)
      .def(
          "replace",
          [](const ModelConfig& c, const nb::kwargs& fields) {
            nlohmann::json doc = config_to_json(c);
            const std::vector<std::string> keys = config_keys();
            for (auto [k, v] : fields) {
              const std::string key = nb::cast<std::string>(k);
              if (std::find(keys.begin(), keys.end(), key) == keys.end())
                usage_fail("Model.replace: unknown field '{}' (known: {})", key, fmt::join(keys, ", "));
              doc[key] = nlohmann::json(from_python(v, key));
            }
            return config_from_json(doc, replaced_origin(c.name.empty() ? "model" : c.name));
          },
          "A copy with fields replaced (n_layer=..., n_expert=...), validated as a preset is.")
      .def_prop_ro("name", [](const ModelConfig& c) { return c.name; })
      .def_prop_ro("arch", [](const ModelConfig& c) { return c.arch; })
      .def_prop_ro("n_layer", [](const ModelConfig& c) { return c.n_layer; })
      .def_prop_ro("n_embd", [](const ModelConfig& c) { return c.n_embd; })
      .def_prop_ro("n_head", [](const ModelConfig& c) { return c.n_head; })
      .def_prop_ro("n_head_kv", [](const ModelConfig& c) { return c.n_head_kv; })
      .def_prop_ro("head_dim", [](const ModelConfig& c) { return c.head_dim; })
      .def_prop_ro("n_ff", [](const ModelConfig& c) { return c.n_ff; })
      .def_prop_ro("n_vocab", [](const ModelConfig& c) { return c.n_vocab; })
      .def_prop_ro("n_ctx_train", [](const ModelConfig& c) { return c.n_ctx_train; })
      .def_prop_ro("n_expert", [](const ModelConfig& c) { return c.n_expert; })
      .def_prop_ro("n_expert_used", [](const ModelConfig& c) { return c.n_expert_used; })
      .def_prop_ro("n_params", [](const ModelConfig& c) { return c.n_params(); })
      .def_prop_ro("n_active_params", [](const ModelConfig& c) { return c.n_active_params(); })
      .def("__repr__",
           [](const ModelConfig& c) { return "Model('" + (c.name.empty() ? c.arch : c.name) + "')"; });

  // ---- simulate
  nb::class_<py::OpTable>(m, "OpCosts",
                          "Per-op costs: arrays over `names` (and over layers first for a per-layer table).")
      .def_prop_ro_static("names", [](nb::handle) { return op_names(); })
      .def_prop_ro("time_s",
                   [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.time_s; }); })
      .def_prop_ro("flop",
                   [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.flops; }); })
      .def_prop_ro("bytes",
                   [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.bytes; }); })
      .def_prop_ro(
          "compute_s",
          [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.compute_s; }); })
      .def_prop_ro("memory_s",
                   [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.memory_s; }); })
      .def_prop_ro(
          "overhead_s",
          [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.overhead_s; }); })
      .def_prop_ro("calls",
                   [](const OpTable& t) { return t.column([](const sim::OpCost& o) { return o.calls; }); });

  nb::class_<sim::Memory>(m, "Memory", "Bytes of one GPU (or the CPU).")
      .def_ro("weights", &sim::Memory::weights)
      .def_ro("kv", &sim::Memory::kv)
      .def_ro("aux", &sim::Memory::aux)
      .def_ro("activations", &sim::Memory::activations)
      .def_prop_ro("total", &sim::Memory::total)
      .def("to_dict", [](const sim::Memory& mem) { return to_python(mem.to_json()); });

  nb::class_<sim::Prediction>(m, "Prediction",
                              "One run's predicted times (s), work and memory on one profile.")
      .def_ro("ttft_s", &sim::Prediction::ttft_s)
      .def_ro("tp", &sim::Prediction::tp)
      .def_ro("pp", &sim::Prediction::pp)
      .def_ro("pp_microbatches", &sim::Prediction::pp_microbatches)
      .def_prop_ro(
          "prefill_pp_s", [](const sim::Prediction& p) { return p.prefill_pp.time_s; },
          "the hand-offs between pipeline stages in the TTFT")
      .def_prop_ro("decode_pp_s", [](const sim::Prediction& p) { return p.decode_pp.time_s; })
      .def_ro("decode_steps", &sim::Prediction::decode_steps)
      .def_ro("decode_s", &sim::Prediction::decode_s)
      .def_ro("total_s", &sim::Prediction::total_s)
      .def_ro("prefill_busy_s", &sim::Prediction::prefill_busy_s)
      .def_ro("prompt_tokens_computed_fraction", &sim::Prediction::prompt_tokens_computed_fraction)
      .def_prop_ro("decode_step_mean_s", &sim::Prediction::decode_step_mean_s)
      .def_prop_ro(
          "decode_step_s",
          [](const sim::Prediction& p) { return to_numpy(p.decode_step_s, {p.decode_step_s.size()}); },
          "The first step_times decoding steps' times, s")
      .def_prop_ro("prefill_flop", &sim::Prediction::prefill_flops)
      .def_prop_ro("prefill_bound_op",
                   [](const sim::Prediction& p) { return std::string(op_name(p.prefill_bound_op())); })
      .def_prop_ro("prefill_comm_s", [](const sim::Prediction& p) { return p.prefill_comm.time_s; })
      .def_prop_ro("decode_comm_s", [](const sim::Prediction& p) { return p.decode_comm.time_s; })
      .def_ro("memory", &sim::Prediction::memory)
      .def_prop_ro("prefill_ops",
                   [](const sim::Prediction& p) {
                     return OpTable{{p.prefill_ops}, false};
                   })
      .def_prop_ro("decode_ops",
                   [](const sim::Prediction& p) {
                     return OpTable{{p.decode_ops}, false};
                   })
      .def_prop_ro(
          "prefill_layers",
          [](const sim::Prediction& p) {
            return OpTable{p.prefill_layers, true};
          },
          "Per layer, [layers, ops] (per_layer=True adds them to to_dict())");

  nb::class_<sim::SimulateResult>(m, "SimulateResult",
                                  "One profile's prediction beside the same work unpruned.")
      .def_ro("hw", &sim::SimulateResult::hw)
      .def_ro("pruned", &sim::SimulateResult::pruned)
      .def_ro("unpruned", &sim::SimulateResult::unpruned)
      .def_prop_ro("fits_in_memory", &sim::SimulateResult::fits_in_memory)
      .def_prop_ro("ttft_speedup",
                   [](const sim::SimulateResult& r) { return r.unpruned.ttft_s / r.pruned.ttft_s; })
      .def_prop_ro("total_speedup",
                   [](const sim::SimulateResult& r) { return r.unpruned.total_s / r.pruned.total_s; });

  nb::class_<sim::SimulateReport>(m, "SimulateReport", "simulate's result: one SimulateResult per profile.")
      .def_ro("model", &sim::SimulateReport::model)
      .def_ro("config", &sim::SimulateReport::config)
      .def_ro("costed", &sim::SimulateReport::costed,
              "The model as one GPU costs it (expert and data parallelism)")
      .def_prop_ro("n_layer", [](const sim::SimulateReport& r) { return r.costed.n_layer; })
      .def_prop_ro("n_params", [](const sim::SimulateReport& r) { return r.costed.n_params(); })
      .def_prop_ro("ep", [](const sim::SimulateReport& r) { return r.costed.ep; })
      .def_ro("pp_microbatches", &sim::SimulateReport::pp_microbatches)
      .def_prop_ro("precision", [](const sim::SimulateReport& r) { return precision_dict(r.precision); })
      .def_ro("trace", &sim::SimulateReport::trace)
      .def_ro("policy", &sim::SimulateReport::policy)
      .def_ro("schedule", &sim::SimulateReport::schedule)
      .def_ro("revivals", &sim::SimulateReport::revivals)
      .def_ro("prompt_tokens", &sim::SimulateReport::prompt_tokens)
      .def_ro("prompt_tokens_dropped", &sim::SimulateReport::prompt_tokens_dropped)
      .def_ro("decode_steps", &sim::SimulateReport::decode_steps)
      .def_ro("tp", &sim::SimulateReport::tp)
      .def_ro("dp", &sim::SimulateReport::dp)
      .def_ro("pp", &sim::SimulateReport::pp)
      .def_ro("results", &sim::SimulateReport::results)
      .def(
          "to_dict", [](const sim::SimulateReport& r) { return to_python(r.to_json()); },
          "`lazyprefill simulate --json`'s document")
      .def(
          "to_json", [](const sim::SimulateReport& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  const sim::SimulateRequest d;
  m.def(
      "simulate",
      [](const nb::handle& hw, const std::optional<std::string>& model, const nb::handle& model_config,
         const std::optional<std::string>& trace, const std::string& prune,
         const std::optional<std::string>& schedule, int64_t prompt_tokens, int64_t new_tokens,
         const std::optional<std::string>& revival_model, std::optional<double> revival_share, bool map,
         const std::string& weights, const std::string& compute, const std::string& kv,
         const std::optional<std::string>& expert_weights, int tp, int ep, int dp, int pp,
         int pp_microbatches, std::optional<double> moe_imbalance, double pp_link_gbs, int64_t step_times,
         bool per_layer, const std::optional<std::string>& engine) {
        sim::SimulateRequest r;
        r.hws = profiles_from(hw, engine);
        target_from(model, model_config, r);
        r.trace = trace.value_or("");
        r.prune = prune;
        r.schedule = schedule.value_or("");
        r.prompt_tokens = prompt_tokens;
        r.new_tokens = new_tokens;
        r.revival_model = revival_model.value_or("");
        r.revival_share = revival_share.value_or(-1);
        r.map = map;
        r.precision = sim::Precision(weights, compute, kv, expert_weights.value_or(""));
        r.tp = tp, r.ep = ep, r.dp = dp, r.pp = pp, r.pp_microbatches = pp_microbatches;
        r.moe_imbalance = moe_imbalance.value_or(0);
        r.pp_link_gbs = pp_link_gbs;
        r.step_times = step_times;
        r.per_layer = per_layer;
        nb::gil_scoped_release unlocked;
        return sim::simulate(r);
      },
      nb::kw_only(), "hw"_a, "model"_a = nb::none(), "model_config"_a = nb::none(), "trace"_a = nb::none(),
      "prune"_a = d.prune, "schedule"_a = nb::none(), "prompt_tokens"_a = d.prompt_tokens,
      "new_tokens"_a = d.new_tokens, "revival_model"_a = nb::none(), "revival_share"_a = nb::none(),
      "map"_a = d.map, "weights"_a = d.precision.weights, "compute"_a = d.precision.compute,
      "kv"_a = d.precision.kv, "expert_weights"_a = nb::none(), "tp"_a = d.tp, "ep"_a = d.ep, "dp"_a = d.dp,
      "pp"_a = d.pp, "pp_microbatches"_a = d.pp_microbatches, "moe_imbalance"_a = nb::none(),
      "pp_link_gbs"_a = d.pp_link_gbs, "step_times"_a = d.step_times, "per_layer"_a = d.per_layer,
      "engine"_a = nb::none(),
      "`lazyprefill simulate` (docs/simulator.md): the keyword arguments are its options, with its "
      "defaults.");

  // ---- simulate_serving
  nb::class_<sim::Percentiles>(m, "Percentiles", "A latency's p50, p90, p99 and mean, s")
      .def_ro("p50", &sim::Percentiles::p50)
      .def_ro("p90", &sim::Percentiles::p90)
      .def_ro("p99", &sim::Percentiles::p99)
      .def_ro("mean", &sim::Percentiles::mean);

  nb::class_<sim::ServingMetrics>(m, "ServingMetrics", "A serving run's figures (s, per s, shares)")
      .def_ro("requests", &sim::ServingMetrics::requests)
      .def_ro("duration_s", &sim::ServingMetrics::duration_s)
      .def_ro("requests_per_s", &sim::ServingMetrics::requests_per_s)
      .def_ro("output_tokens_per_s", &sim::ServingMetrics::output_tokens_per_s)
      .def_ro("prompt_tokens_per_s", &sim::ServingMetrics::prompt_tokens_per_s)
      .def_ro("goodput_per_s", &sim::ServingMetrics::goodput_per_s)
      .def_ro("ttft", &sim::ServingMetrics::ttft)
      .def_ro("itl", &sim::ServingMetrics::itl)
      .def_ro("e2e", &sim::ServingMetrics::e2e)
      .def_ro("queue", &sim::ServingMetrics::queue)
      .def_ro("kv_utilisation_mean", &sim::ServingMetrics::kv_utilisation_mean)
      .def_ro("kv_utilisation_peak", &sim::ServingMetrics::kv_utilisation_peak)
      .def_ro("prompt_share_mean", &sim::ServingMetrics::prompt_tokens_computed_fraction_mean);

  nb::class_<sim::ServingRunResult>(m, "ServingRun", "One hardware x method x rate run")
      .def_ro("hw", &sim::ServingRunResult::hw)
      .def_ro("method", &sim::ServingRunResult::method)
      .def_ro("rate", &sim::ServingRunResult::rate, "requests/s (inf: all at once; 0: an arrival file's)")
      .def_ro("metrics", &sim::ServingRunResult::metrics)
      .def_ro("iterations", &sim::ServingRunResult::iterations)
      .def_ro("preemptions", &sim::ServingRunResult::preemptions)
      .def_ro("prompt_tokens_cached_share", &sim::ServingRunResult::prompt_tokens_cached_share)
      .def_prop_ro(
          "deployment", [](const sim::ServingRunResult& r) { return to_python(r.deployment); },
          "replicas or disaggregated instances and the router (None for one engine)")
      .def_prop_ro(
          "handover", [](const sim::ServingRunResult& r) { return to_python(r.handover); },
          "disaggregated: the K/V hand-overs (None otherwise)")
      .def_prop_ro(
          "kv",
          [](const sim::ServingRunResult& r) {
            std::vector<double> v;
            for (const sim::KvPoint& p : r.kv) v.insert(v.end(), {p.t_s, p.reserved, p.used});
            return to_numpy(std::move(v), {r.kv.size(), 3});
          },
          "K/V over time, [points, 3]: t (s), reserved and used (bytes)")
      .def_prop_ro(
          "requests", [](const sim::ServingRunResult& r) { return request_arrays(r.requests); },
          "keep_requests=True: per-request arrays (arrival_s, ttft_s, itl_s, ...); else empty ones")
      .def("to_dict", [](const sim::ServingRunResult& r) { return to_python(r.to_json()); });

  nb::class_<sim::CapacityRun>(m, "CapacityRun", "One hardware x method capacity search")
      .def_ro("hw", &sim::CapacityRun::hw)
      .def_ro("method", &sim::CapacityRun::method)
      .def_prop_ro("met", [](const sim::CapacityRun& c) { return c.result.met; })
      .def_prop_ro(
          "rate", [](const sim::CapacityRun& c) { return c.result.rate; }, "requests/s, the seeds' median")
      .def_prop_ro("rate_min", [](const sim::CapacityRun& c) { return c.result.rate_min; })
      .def_prop_ro("rate_max", [](const sim::CapacityRun& c) { return c.result.rate_max; })
      .def_prop_ro("resolution", [](const sim::CapacityRun& c) { return c.result.bracket; })
      .def_prop_ro("simulations", [](const sim::CapacityRun& c) { return c.result.simulations; })
      .def_prop_ro("at_rate", [](const sim::CapacityRun& c) { return c.result.at_rate; })
      .def_prop_ro("best_at_lowest_rate", [](const sim::CapacityRun& c) { return c.result.best; })
      .def("to_dict", [](const sim::CapacityRun& c) { return to_python(c.to_json()); });

  nb::class_<sim::ServingStudyReport>(m, "ServingReport", "simulate_serving's result")
      .def_ro("model", &sim::ServingStudyReport::model)
      .def_ro("schedule", &sim::ServingStudyReport::schedule)
      .def_ro("revivals", &sim::ServingStudyReport::revivals)
      .def_ro("runs", &sim::ServingStudyReport::runs,
              "Without capacity: hardware-major, then method, then rate")
      .def_ro("capacities", &sim::ServingStudyReport::capacities, "With capacity=True")
      .def_prop_ro("scheduler", [](const sim::ServingStudyReport& r) { return to_python(r.scheduler); })
      .def_prop_ro("workload", [](const sim::ServingStudyReport& r) { return to_python(r.workload); })
      .def_prop_ro(
          "schedulers", [](const sim::ServingStudyReport& r) { return to_python(r.schedulers); },
          "every profile's scheduler (None with one profile)")
      .def_prop_ro("objectives", [](const sim::ServingStudyReport& r) { return to_python(r.objectives); })
      .def(
          "to_dict", [](const sim::ServingStudyReport& r) { return to_python(r.to_json()); },
          "`lazyprefill simulate-serving --json`'s document")
      .def(
          "to_json",
          [](const sim::ServingStudyReport& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  const sim::ServingStudyRequest ds;
  m.def(
      "simulate_serving",
      [](const nb::handle& hw, const std::optional<std::string>& model, const nb::handle& model_config,
         const std::optional<std::string>& engine, const std::optional<std::string>& prefill_hw,
         const std::string& weights, const std::string& compute, const std::string& kv,
         const std::optional<std::string>& expert_weights, const std::string& prune,
         const std::optional<std::string>& schedule, const std::optional<std::string>& revival_model,
         std::optional<double> revival_share, const std::optional<std::string>& arrival_file,
         const nb::handle& rate, double cv, int64_t requests, const nb::handle& prompt_tokens,
         const nb::handle& output_tokens, uint64_t seed, std::optional<int64_t> max_batch_tokens,
         std::optional<int64_t> chunk_tokens, std::optional<int64_t> max_seqs,
         std::optional<int64_t> kv_block_tokens, std::optional<double> iteration_overhead_ms,
         std::optional<double> request_overhead_ms, const std::optional<std::string>& kv_mode,
         std::optional<bool> mixed, std::optional<int64_t> concurrency, int64_t warmup, int64_t cooldown,
         double kv_budget_mib, std::optional<double> kv_element_bytes, int tp, int ep, int dp, int pp,
         std::optional<double> moe_imbalance, double pp_link_gbs, bool capacity,
         std::optional<double> slo_ttft_p90_ms, std::optional<double> slo_itl_p90_ms, int seeds,
         double tolerance, bool prefix_cache, int64_t prefix_block_tokens,
         const std::optional<std::string>& shared_prefix, int replicas, const std::string& router,
         const std::optional<std::string>& disaggregate, std::optional<double> kv_link_gbs,
         std::optional<double> kv_link_us, bool keep_requests) {
        sim::ServingStudyRequest r;
        r.hws = profiles_from(hw, engine);
        if (prefill_hw) r.prefill_hw = profiles_from(nb::str(prefill_hw->c_str()), engine).at(0);
        target_from(model, model_config, r);
        r.precision = sim::Precision(weights, compute, kv, expert_weights.value_or(""));
        r.prune = prune;
        r.schedule = schedule.value_or("");
        r.revival_model = revival_model.value_or("");
        r.revival_share = revival_share.value_or(-1);
        r.arrival_file = arrival_file.value_or("");
        r.rates = rates_from(rate);
        r.cv = cv;
        r.requests = requests;
        r.prompt_tokens = length_spec(prompt_tokens, "prompt_tokens");
        r.output_tokens = length_spec(output_tokens, "output_tokens");
        r.seed = seed;
        r.sched = {
            max_batch_tokens,    chunk_tokens,         max_seqs, kv_block_tokens, iteration_overhead_ms,
            request_overhead_ms, kv_mode.value_or(""), mixed};
        r.concurrency = concurrency;
        r.warmup = warmup, r.cooldown = cooldown;
        r.kv_budget_mib = kv_budget_mib;
        r.kv_element_bytes = kv_element_bytes.value_or(0);
        r.tp = tp, r.ep = ep, r.dp = dp, r.pp = pp;
        r.moe_imbalance = moe_imbalance.value_or(0);
        r.pp_link_gbs = pp_link_gbs;
        r.capacity = capacity;
        r.slo_ttft_ms = slo_ttft_p90_ms.value_or(0), r.slo_itl_ms = slo_itl_p90_ms.value_or(0);
        r.seeds = seeds;
        r.tolerance = tolerance;
        r.prefix_cache = prefix_cache;
        r.prefix_block_tokens = prefix_block_tokens;
        r.shared_prefix = shared_prefix.value_or("");
        r.replicas = replicas;
        r.router = router;
        r.disaggregate = disaggregate.value_or("");
        r.kv_link_gbs = kv_link_gbs.value_or(0);
        r.kv_link_us = kv_link_us.value_or(-1);
        r.keep_requests = keep_requests;
        nb::gil_scoped_release unlocked;
        return sim::serving_study(r);
      },
      nb::kw_only(), "hw"_a, "model"_a = nb::none(), "model_config"_a = nb::none(), "engine"_a = nb::none(),
      "prefill_hw"_a = nb::none(), "weights"_a = ds.precision.weights, "compute"_a = ds.precision.compute,
      "kv"_a = ds.precision.kv, "expert_weights"_a = nb::none(), "prune"_a = ds.prune,
      "schedule"_a = nb::none(), "revival_model"_a = nb::none(), "revival_share"_a = nb::none(),
      "arrival_file"_a = nb::none(), "rate"_a = nb::none(), "cv"_a = ds.cv, "requests"_a = ds.requests,
      "prompt_tokens"_a = ds.prompt_tokens, "output_tokens"_a = ds.output_tokens, "seed"_a = ds.seed,
      "max_batch_tokens"_a = nb::none(), "chunk_tokens"_a = nb::none(), "max_seqs"_a = nb::none(),
      "kv_block_tokens"_a = nb::none(), "iteration_overhead_ms"_a = nb::none(),
      "request_overhead_ms"_a = nb::none(), "kv_mode"_a = nb::none(), "mixed"_a = nb::none(),
      "concurrency"_a = nb::none(), "warmup"_a = ds.warmup, "cooldown"_a = ds.cooldown,
      "kv_budget_mib"_a = ds.kv_budget_mib, "kv_element_bytes"_a = nb::none(), "tp"_a = ds.tp, "ep"_a = ds.ep,
      "dp"_a = ds.dp, "pp"_a = ds.pp, "moe_imbalance"_a = nb::none(), "pp_link_gbs"_a = ds.pp_link_gbs,
      "capacity"_a = ds.capacity, "slo_ttft_p90_ms"_a = nb::none(), "slo_itl_p90_ms"_a = nb::none(),
      "seeds"_a = ds.seeds, "tolerance"_a = ds.tolerance, "prefix_cache"_a = ds.prefix_cache,
      "prefix_block_tokens"_a = ds.prefix_block_tokens, "shared_prefix"_a = nb::none(),
      "replicas"_a = ds.replicas, "router"_a = ds.router, "disaggregate"_a = nb::none(),
      "kv_link_gbs"_a = nb::none(), "kv_link_us"_a = nb::none(), "keep_requests"_a = ds.keep_requests,
      "`lazyprefill simulate-serving` (docs/simulator.md): the keyword arguments are its options, with its "
      "defaults; rate is a number or a list (inf: all at once).");
  // ---- compare
  nb::class_<sim::CompareRow>(m, "CompareRow", "One way to cut TTFT at one prompt length")
      .def_ro("method", &sim::CompareRow::method)
      .def_ro("family", &sim::CompareRow::family)
      .def_ro("devices", &sim::CompareRow::devices)
      .def_ro("ttft_s", &sim::CompareRow::ttft_s)
      .def_ro("speedup", &sim::CompareRow::speedup)
      .def_ro("memory_bytes", &sim::CompareRow::memory_bytes, "per device, the fullest one")
      .def_ro("fits", &sim::CompareRow::fits)
      .def_ro("refused", &sim::CompareRow::refused)
      .def_ro("note", &sim::CompareRow::note)
      .def_ro("accuracy", &sim::CompareRow::accuracy_note);

  nb::class_<sim::CompareTable>(m, "CompareTable", "Every method at one prompt length")
      .def_ro("prompt_tokens", &sim::CompareTable::prompt_tokens)
      .def_ro("rows", &sim::CompareTable::rows);

  nb::class_<sim::CompareReport>(m, "CompareReport", "compare's result: one table per prompt length")
      .def_ro("model", &sim::CompareReport::model)
      .def_ro("hw", &sim::CompareReport::hw)
      .def_ro("devices", &sim::CompareReport::devices)
      .def_ro("combined_schedule", &sim::CompareReport::combined_schedule)
      .def_prop_ro("precision", [](const sim::CompareReport& r) { return precision_dict(r.precision); })
      .def_prop_ro("kv_prediction_accuracy",
                   [](const sim::CompareReport& r) -> std::optional<std::string> {
                     if (!r.kv_predict) return std::nullopt;
                     return std::string(sim::kv_predict_accuracy_note());
                   })
      .def_prop_ro("tp_refused", [](const sim::CompareReport& r) { return r.comparison.tp_refused; })
      .def_prop_ro("tables", [](const sim::CompareReport& r) { return r.comparison.tables; })
      .def_prop_ro(
          "methods",
          [](const sim::CompareReport& r) {
            std::vector<std::string> out;
            if (!r.comparison.tables.empty())
              for (const sim::CompareRow& row : r.comparison.tables.front().rows) out.push_back(row.method);
            return out;
          },
          "The methods, in the tables' order")
      .def_prop_ro("prompt_tokens",
                   [](const sim::CompareReport& r) {
                     std::vector<double> v;
                     for (const sim::CompareTable& t : r.comparison.tables)
                       v.push_back(double(t.prompt_tokens));
                     return to_numpy(std::move(v), {r.comparison.tables.size()});
                   })
      .def_prop_ro(
          "ttft_s",
          [](const sim::CompareReport& r) {
            const auto& tables = r.comparison.tables;
            const size_t methods = tables.empty() ? 0 : tables.front().rows.size();
            std::vector<double> v;
            for (const sim::CompareTable& t : tables) {
              if (t.rows.size() != methods) internal_fail("compare's tables hold different methods");
              for (const sim::CompareRow& row : t.rows) v.push_back(row.refused ? std::nan("") : row.ttft_s);
            }
            return to_numpy(std::move(v), {tables.size(), methods});
          },
          "[prompt lengths, methods], s; NaN where a method is refused")
      .def(
          "to_dict", [](const sim::CompareReport& r) { return to_python(r.to_json()); },
          "`lazyprefill compare --json`'s document")
      .def(
          "to_json", [](const sim::CompareReport& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  const sim::CompareRequest dc;
  m.def(
      "compare",
      [](const nb::handle& hw, const std::optional<std::string>& model, const nb::handle& model_config,
         const std::optional<std::string>& engine, const std::string& weights, const std::string& compute,
         const std::string& kv, const std::optional<std::string>& expert_weights, int devices,
         const nb::handle& prompt_tokens, const nb::handle& schedule,
         const std::optional<std::string>& kv_predict, const std::optional<std::string>& eval) {
        sim::CompareRequest r;
        r.hws = profiles_from(hw, engine);
        target_from(model, model_config, r);
        r.precision = sim::Precision(weights, compute, kv, expert_weights.value_or(""));
        r.devices = devices;
        if (!prompt_tokens.is_none()) r.prompt_tokens = ints_from(prompt_tokens, "prompt_tokens");
        if (nb::isinstance<nb::str>(schedule))
          r.schedules = {nb::cast<std::string>(schedule)};
        else if (!schedule.is_none())
          r.schedules = nb::cast<std::vector<std::string>>(schedule);
        r.kv_predict = kv_predict.value_or("");
        r.eval = eval.value_or("");
        nb::gil_scoped_release unlocked;
        return sim::compare(r);
      },
      nb::kw_only(), "hw"_a, "model"_a = nb::none(), "model_config"_a = nb::none(), "engine"_a = nb::none(),
      "weights"_a = dc.precision.weights, "compute"_a = dc.precision.compute, "kv"_a = dc.precision.kv,
      "expert_weights"_a = nb::none(), "devices"_a = dc.devices, "prompt_tokens"_a = dc.prompt_tokens,
      "schedule"_a = nb::none(), "kv_predict"_a = nb::none(), "eval"_a = nb::none(),
      "`lazyprefill compare` (docs/cli.md): every way to cut TTFT side by side; prompt_tokens a number or a "
      "list, schedule one or a list.");
  // ---- plan
  nb::class_<PlanRow>(m, "PlanPoint", "One layout x budget x method at one load, as plan's document has it")
      .def_ro("layout", &PlanRow::layout)
      .def_ro("disaggregated", &PlanRow::disaggregated)
      .def_ro("tp", &PlanRow::tp)
      .def_ro("instances", &PlanRow::instances)
      .def_ro("decode_tp", &PlanRow::decode_tp)
      .def_ro("decode_instances", &PlanRow::decode_instances)
      .def_ro("pp", &PlanRow::pp)
      .def_ro("expert_parallel", &PlanRow::expert_parallel)
      .def_ro("gpus", &PlanRow::gpus)
      .def_ro("max_batch_tokens", &PlanRow::max_batch_tokens)
      .def_ro("max_seqs", &PlanRow::max_seqs)
      .def_ro("method", &PlanRow::method)
      .def_ro("rate", &PlanRow::rate, "requests/s")
      .def_ro("output_tokens_per_s_per_gpu", &PlanRow::per_gpu)
      .def_ro("output_tokens_per_s_per_user", &PlanRow::per_user)
      .def_ro("metrics", &PlanRow::metrics)
      .def_ro("meets_objectives", &PlanRow::meets)
      .def_ro("launch", &PlanRow::launch, "(engine, command) pairs: only on best and best_reachable")
      .def_prop_ro(
          "accuracy", [](const PlanRow& p) { return to_python(p.accuracy); },
          "a pruned method's accuracy evidence (None unpruned)");

  nb::class_<report::PlanReport>(m, "PlanReport", "plan's result: the frontier and the best layout")
      .def_ro("model", &report::PlanReport::model)
      .def_ro("hw", &report::PlanReport::hw)
      .def_ro("gpus", &report::PlanReport::gpus)
      .def_prop_ro("layouts_searched", [](const report::PlanReport& r) { return r.result.layouts.size(); })
      .def_prop_ro("layouts_refused", [](const report::PlanReport& r) { return r.result.layouts_refused; })
      .def_prop_ro("simulations", [](const report::PlanReport& r) { return r.result.simulations; })
      .def_prop_ro("methods",
                   [](const report::PlanReport& r) {
                     std::vector<std::string> out;
                     for (const sim::ServingMethod& sm : r.options.methods) out.push_back(sm.name);
                     return out;
                   })
      .def_prop_ro(
          "points",
          [](const report::PlanReport& r) {
            std::vector<PlanRow> out;
            for (size_t i = 0; i < r.result.points.size(); ++i) out.push_back(plan_row(r, i, false));
            return out;
          },
          "Every simulated point, in layout order")
      .def_prop_ro(
          "frontier",
          [](const report::PlanReport& r) {
            std::vector<PlanRow> out;
            for (const size_t i : r.result.frontier) out.push_back(plan_row(r, i, false));
            return out;
          },
          "The Pareto frontier, fastest per user first")
      .def_prop_ro(
          "best",
          [](const report::PlanReport& r) -> std::optional<PlanRow> {
            if (!r.result.best) return std::nullopt;
            return plan_row(r, *r.result.best, true);
          },
          "The point meeting the objectives with the most tokens/s per GPU (None: none meets them)")
      .def_prop_ro(
          "best_reachable",
          [](const report::PlanReport& r) -> std::optional<PlanRow> {
            if (r.result.best || !r.result.best_reachable) return std::nullopt;
            return plan_row(r, *r.result.best_reachable, true);
          },
          "When no point meets the objectives: the closest")
      .def_prop_ro("accuracy", [](const report::PlanReport& r) { return to_python(r.accuracy); })
      .def(
          "to_dict", [](const report::PlanReport& r) { return to_python(r.to_json()); },
          "`lazyprefill plan --json`'s document")
      .def(
          "to_json", [](const report::PlanReport& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  const report::PlanRequest dp;
  m.def(
      "plan",
      [](const nb::handle& hw, const std::optional<std::string>& model, const nb::handle& model_config,
         const std::optional<std::string>& engine, const std::string& weights, const std::string& compute,
         const std::string& kv, const std::optional<std::string>& expert_weights, int gpus,
         const std::string& prune, const nb::handle& schedule, const nb::handle& prompt_tokens,
         const nb::handle& output_tokens, const std::vector<int64_t>& batch_tokens,
         const std::vector<int64_t>& max_seqs, const std::vector<int>& pp, const std::string& expert_parallel,
         const std::vector<double>& loads, std::optional<double> slo_ttft_p90_ms,
         std::optional<double> slo_itl_p90_ms, double memory_fraction, int64_t requests, int64_t max_layouts,
         bool aggregated_only, uint64_t seed, const std::optional<std::string>& eval) {
        report::PlanRequest r;
        r.hws = profiles_from(hw, engine);
        target_from(model, model_config, r);
        r.precision = sim::Precision(weights, compute, kv, expert_weights.value_or(""));
        r.gpus = gpus;
        r.prune = prune;
        r.schedules = strings_from(schedule, "schedule");
        r.prompt_tokens = length_spec(prompt_tokens, "prompt_tokens");
        r.output_tokens = length_spec(output_tokens, "output_tokens");
        r.batch_tokens = batch_tokens;
        r.max_seqs = max_seqs;
        r.pp = pp;
        r.expert_parallel = expert_parallel;
        r.loads = loads;
        r.slo_ttft_ms = slo_ttft_p90_ms.value_or(0), r.slo_itl_ms = slo_itl_p90_ms.value_or(0);
        r.memory_fraction = memory_fraction;
        r.requests = requests;
        r.max_layouts = max_layouts;
        r.aggregated_only = aggregated_only;
        r.seed = seed;
        r.eval = eval.value_or("");
        nb::gil_scoped_release unlocked;
        return *report::plan(r);
      },
      nb::kw_only(), "hw"_a, "model"_a = nb::none(), "model_config"_a = nb::none(), "engine"_a = nb::none(),
      "weights"_a = dp.precision.weights, "compute"_a = dp.precision.compute, "kv"_a = dp.precision.kv,
      "expert_weights"_a = nb::none(), "gpus"_a = dp.gpus, "prune"_a = dp.prune, "schedule"_a = nb::none(),
      "prompt_tokens"_a = dp.prompt_tokens, "output_tokens"_a = dp.output_tokens,
      "batch_tokens"_a = dp.batch_tokens, "max_seqs"_a = dp.max_seqs, "pp"_a = dp.pp,
      "expert_parallel"_a = dp.expert_parallel, "loads"_a = dp.loads, "slo_ttft_p90_ms"_a = nb::none(),
      "slo_itl_p90_ms"_a = nb::none(), "memory_fraction"_a = dp.memory_fraction, "requests"_a = dp.requests,
      "max_layouts"_a = dp.max_layouts, "aggregated_only"_a = dp.aggregated_only, "seed"_a = dp.seed,
      "eval"_a = nb::none(),
      "`lazyprefill plan` (docs/simulator.md, \"Planning a deployment\"): every layout of the model over "
      "`gpus` "
      "GPUs of `hw`, the frontier and the best within the objectives.");
  // ---- report
  nb::class_<report::Report>(
      m, "Report", "report's capacity report: per hardware x method x prompt length, arrays [H, M, L]")
      .def_prop_ro("hardware",
                   [](const report::Report& r) {
                     std::vector<std::string> out;
                     for (const auto& h : r.provenance.hardware) out.push_back(h.name);
                     return out;
                   })
      .def_prop_ro("methods",
                   [](const report::Report& r) {
                     std::vector<std::string> out;
                     for (const auto& mm : r.provenance.methods) out.push_back(mm.name);
                     return out;
                   })
      .def_prop_ro("prompt_lengths",
                   [](const report::Report& r) {
                     std::vector<double> v(r.prompt_lengths.begin(), r.prompt_lengths.end());
                     return to_numpy(std::move(v), {r.prompt_lengths.size()});
                   })
      .def_prop_ro("ttft_s",
                   [](const report::Report& r) {
                     return cells(r, [](const report::Result& c) { return c.ttft_ms * 1e-3; });
                   })
      .def_prop_ro("baseline_ttft_s",
                   [](const report::Report& r) {
                     return cells(r, [](const report::Result& c) { return c.baseline_ttft_ms * 1e-3; });
                   })
      .def_prop_ro(
          "speedup",
          [](const report::Report& r) { return cells(r, [](const report::Result& c) { return c.speedup; }); })
      .def_prop_ro("prompt_tokens_computed_fraction",
                   [](const report::Report& r) {
                     return cells(r,
                                  [](const report::Result& c) { return c.prompt_tokens_computed_fraction; });
                   })
      .def_prop_ro("prefill_flop",
                   [](const report::Report& r) {
                     return cells(r, [](const report::Result& c) { return c.prefill_flop; });
                   })
      .def_prop_ro("decode_step_mean_s",
                   [](const report::Report& r) {
                     return cells(r, [](const report::Result& c) { return c.decode_step_mean_ms * 1e-3; });
                   })
      .def_prop_ro("memory_bytes",
                   [](const report::Report& r) {
                     return cells(r, [](const report::Result& c) { return c.memory.total(); });
                   })
      .def_prop_ro(
          "fits_in_memory",
          [](const report::Report& r) {
            return cells(r, [](const report::Result& c) { return c.fits_in_memory ? 1.0 : 0.0; });
          },
          "1 where the case fits a device's memory budget, else 0")
      .def_prop_ro(
          "max_prompt_tokens_within_slo",
          [](const report::Report& r) {
            const size_t H = r.provenance.hardware.size(), M = r.provenance.methods.size();
            std::vector<double> v(H * M, std::nan(""));
            for (const report::Capacity& c : r.capacity)
              if (c.max_prompt_tokens_within_slo)
                v[c.hw * M + c.method] = double(*c.max_prompt_tokens_within_slo);
            return to_numpy(std::move(v), {H, M});
          },
          "[H, M]: the longest prompt within slo_ttft_ms (NaN: none, or no objective)")
      .def("summary", &report::summary_text, "The CLI's table")
      .def("write", &write_report, "out"_a, "validation"_a = nb::none(), "plan"_a = nb::none(),
           "Writes the report's folder as `report --out` does (validation: a validate --json file; plan: a "
           "plan "
           "--out file); returns the number of charts")
      .def(
          "to_dict", [](const report::Report& r) { return to_python(r.to_json()); },
          "`lazyprefill report --json`'s document (reports/capacity-report.schema.json)")
      .def(
          "to_json", [](const report::Report& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  const report::ReportOptions dr;
  m.def(
      "report",
      [](const nb::handle& hw, const std::optional<std::string>& model, const nb::handle& model_config,
         const std::optional<std::string>& engine, const std::string& weights, const std::string& compute,
         const std::string& kv, const std::optional<std::string>& expert_weights,
         const nb::handle& prompt_lengths, const std::optional<std::string>& trace, const std::string& prune,
         const nb::handle& schedule, const std::optional<std::string>& revival_model,
         std::optional<double> revival_share, bool map, int64_t new_tokens, int64_t batch, int tp, int ep,
         int dp, int pp, std::optional<double> moe_imbalance, double pp_link_gbs,
         std::optional<double> slo_ttft_ms, std::optional<double> mem_budget_gib,
         std::optional<double> serving_slo_ttft_p90_ms, std::optional<double> serving_slo_itl_p90_ms,
         const nb::handle& serving_prompt_tokens, const nb::handle& serving_output_tokens,
         int64_t serving_requests, int serving_seeds, int64_t serving_max_batch_tokens,
         std::optional<double> serving_kv_budget_gib, const std::optional<std::string>& eval,
         const std::optional<std::string>& out, const std::optional<std::string>& validation,
         const std::optional<std::string>& plan) {
        report::ReportOptions o;
        o.hws = profiles_from(hw, engine);
        target_from(model, model_config, o);
        o.precision = sim::Precision(weights, compute, kv, expert_weights.value_or(""));
        o.lengths = ints_from(prompt_lengths, "prompt_lengths");
        o.trace = trace.value_or("");
        o.prune = prune;
        o.schedules = strings_from(schedule, "schedule");
        o.revival_model = revival_model.value_or("");
        o.revival_share = revival_share.value_or(-1);
        o.map = map;
        o.new_tokens = new_tokens, o.batch = batch;
        o.tp = tp, o.ep = ep, o.dp = dp, o.pp = pp;
        o.moe_imbalance = moe_imbalance.value_or(0);
        o.pp_link_gbs = pp_link_gbs;
        o.slo_ttft_ms = slo_ttft_ms, o.mem_budget_gib = mem_budget_gib;
        o.serving_ttft_p90_ms = serving_slo_ttft_p90_ms.value_or(0);
        o.serving_itl_p90_ms = serving_slo_itl_p90_ms.value_or(0);
        o.serving_prompt_tokens = length_spec(serving_prompt_tokens, "serving_prompt_tokens");
        o.serving_output_tokens = length_spec(serving_output_tokens, "serving_output_tokens");
        o.serving_requests = serving_requests, o.serving_seeds = serving_seeds;
        o.serving_max_batch_tokens = serving_max_batch_tokens;
        o.serving_kv_budget_gib = serving_kv_budget_gib.value_or(0);
        o.eval = eval.value_or("");
        o.tool_version = LP_VERSION;
        o.git_commit = LP_GIT_COMMIT;
        nb::gil_scoped_release unlocked;
        // As the CLI: the folder's inputs read before the report is built.
        const nlohmann::json v = report::read_validation(validation.value_or(""));
        const std::optional<report::PlanSummary> p = report::read_plan_file(plan.value_or(""));
        report::Report rep = report::make_report(o);
        if (out) {
          std::vector<std::string> inputs;
          for (const hw::Profile& h : o.hws) inputs.push_back(h.name);
          inputs.insert(inputs.end(), {o.trace, validation.value_or(""), o.revival_model, o.model,
                                       plan.value_or(""), o.eval});
          report::write_report_folder(*out, rep, v, p, inputs);
        }
        return rep;
      },
      nb::kw_only(), "hw"_a, "model"_a = nb::none(), "model_config"_a = nb::none(), "engine"_a = nb::none(),
      "weights"_a = dr.precision.weights, "compute"_a = dr.precision.compute, "kv"_a = dr.precision.kv,
      "expert_weights"_a = nb::none(), "prompt_lengths"_a, "trace"_a = nb::none(), "prune"_a = dr.prune,
      "schedule"_a = nb::none(), "revival_model"_a = nb::none(), "revival_share"_a = nb::none(),
      "map"_a = dr.map, "new_tokens"_a = dr.new_tokens, "batch"_a = dr.batch, "tp"_a = dr.tp, "ep"_a = dr.ep,
      "dp"_a = dr.dp, "pp"_a = dr.pp, "moe_imbalance"_a = nb::none(), "pp_link_gbs"_a = dr.pp_link_gbs,
      "slo_ttft_ms"_a = nb::none(), "mem_budget_gib"_a = nb::none(), "serving_slo_ttft_p90_ms"_a = nb::none(),
      "serving_slo_itl_p90_ms"_a = nb::none(), "serving_prompt_tokens"_a = dr.serving_prompt_tokens,
      "serving_output_tokens"_a = dr.serving_output_tokens, "serving_requests"_a = dr.serving_requests,
      "serving_seeds"_a = dr.serving_seeds, "serving_max_batch_tokens"_a = dr.serving_max_batch_tokens,
      "serving_kv_budget_gib"_a = nb::none(), "eval"_a = nb::none(), "out"_a = nb::none(),
      "validation"_a = nb::none(), "plan"_a = nb::none(),
      "`lazyprefill report` (docs/cli.md): the capacity report; with out, its folder written as the CLI "
      "writes it.");
  // ---- calibrate, calibrate-serving (calibrate.cpp)
  bind_calibrate(m);
}
