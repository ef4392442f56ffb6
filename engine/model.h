// A loaded model: its configuration, tokenizer and weights (dequantized at load into the compute
// dtype, kernels/weights.h). Backends borrow the weights; sessions run over a backend.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kernels/context.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/tokenizer.h"

namespace lp {

class Model {
 public:
  // Loads config, tokenizer and weights. Throws lp::Error on any problem with the file.
  // for_cpu: false for a model a GPU backend runs (load_weights: no CPU packing).
  static std::unique_ptr<Model> load(const std::string& path, DType dtype, CpuContext& ctx,
                                     bool for_cpu = true);
  // The same in `--dtype auto`'s choice for the CPU (auto_cpu_dtype, kernels/weights.h: int8 for a
  // quantized file), the file opened once; weights().dtype says which.
  static std::unique_ptr<Model> load_auto(const std::string& path, CpuContext& ctx);
  // As `--dtype` asks, for every command that loads a model: `dtype`, or with none (auto) bf16 for
  // a GPU backend (tensor cores, half the weight memory) and load_auto's choice for the CPU.
  static std::unique_ptr<Model> load_as(const std::string& path, std::optional<DType> dtype, CpuContext& ctx,
                                        bool for_cpu);

  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return w_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const std::string& path() const { return path_; }

  Model(ModelConfig c, Weights w, std::unique_ptr<Tokenizer> t, std::string path)
      : cfg_(std::move(c)), w_(std::move(w)), tok_(std::move(t)), path_(std::move(path)) {}

 private:
  ModelConfig cfg_;
  Weights w_;
  std::unique_ptr<Tokenizer> tok_;
  std::string path_;
};

// Peak resident set size of this process so far, in MiB.
double peak_rss_mib();

}  // namespace lp
