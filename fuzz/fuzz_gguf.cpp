// GGUF reader, model configuration (the engine's and the simulator's), vocabulary and tokenizer construction,
// and the dequantizers over every tensor the file declares (small ones: the harness bounds its own memory).
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/tokenizer.h"
#include "model/vocab.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    const lp::GgufFile f = lp::GgufFile::open(path);
    for (const lp::GgufTensor& t : f.tensors()) {
      const auto info = lp::type_info(uint32_t(t.type));
      if (!info || !info->dequantizable || t.n_elems > (1 << 16)) continue;
      std::vector<float> out(static_cast<size_t>(t.n_elems));
      lp::dequantize(t.type, t.data, out.data(), t.n_elems);
    }
  });
  lp::fuzz::refuses_cleanly([&] { (void)lp::config_from_gguf(lp::GgufFile::open(path)); });
  lp::fuzz::refuses_cleanly([&] { (void)lp::costing_config_from_gguf(lp::GgufFile::open(path)); });
  lp::fuzz::refuses_cleanly([&] {
    lp::Tokenizer tok(lp::vocab_from_gguf(lp::GgufFile::open(path)));
    (void)tok.encode("Hello, world! 123 <|im_start|>", true, true);
  });
  return 0;
}
