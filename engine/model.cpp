#include "engine/model.h"

#include <sys/resource.h>

#include "engine/memory_budget.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/vocab.h"

namespace lp {

namespace {
std::unique_ptr<Model> from_file(const std::shared_ptr<GgufFile>& file, const std::string& path, DType dtype,
                                 CpuContext& ctx, bool for_cpu = true) {
  const GgufFile& f = *file;
  ModelConfig c = config_from_gguf(f);
  auto tok = std::make_unique<Tokenizer>(vocab_from_gguf(f));
  if (tok->n_vocab() != c.n_vocab)
    fail("{}: tokenizer has {} tokens but the embedding has {} rows", path, tok->n_vocab(), c.n_vocab);
  // Before any weight is copied: a file whose weights cannot fit is refused with both sizes.
  check_weights_fit(f, dtype, memory_budget(read_memory_sources()));
  Weights w = load_weights(file, c, dtype, ctx, for_cpu);
  file->drop_metadata();  // int8 weights may keep the mapping; nothing reads the metadata again
  return std::make_unique<Model>(std::move(c), std::move(w), std::move(tok), path);
}
}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, DType dtype, CpuContext& ctx, bool for_cpu) {
  return from_file(std::make_shared<GgufFile>(GgufFile::open(path)), path, dtype, ctx, for_cpu);
}

std::unique_ptr<Model> Model::load_auto(const std::string& path, CpuContext& ctx) {
  const auto file = std::make_shared<GgufFile>(GgufFile::open(path));
  return from_file(file, path, auto_cpu_dtype(*file), ctx);
}

std::unique_ptr<Model> Model::load_as(const std::string& path, std::optional<DType> dtype, CpuContext& ctx,
                                      bool for_cpu) {
  if (dtype) return load(path, *dtype, ctx, for_cpu);
  return for_cpu ? load_auto(path, ctx) : load(path, DType::BF16, ctx, false);
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace lp
