// The OpenAI request reader (`serve`'s POST bodies, the bytes any client controls): parse_request
// for completions and chat completions, on the tests' tiny byte-level vocabulary and a 256-token
// context. Every input must be accepted or refused with an ApiError (a 4xx the server sends); a
// crash, a sanitizer report, any other exception (a JSON read the checks missed included) or a hang
// is a finding. An accepted request must hold what the engine relies on: a prompt within the
// context with room for max_tokens, sampling parameters finite and in range.
#include <cmath>
#include <cstdlib>
#include <memory>

#include "fuzz/fuzz_util.h"
#include "fuzz/tiny_vocab.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "server/openai.h"

namespace {

struct Setup {
  std::unique_ptr<lp::Tokenizer> tok;
  lp::ModelConfig c;
  lp::server::ApiDefaults d;
  Setup() {
    lp::VocabData data = lp::fuzz::tiny_vocab_data();
    const int n_vocab = int(data.tokens.size());
    tok = std::make_unique<lp::Tokenizer>(std::move(data));
    c.arch = "llama";
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 16, c.n_ff = 96;
    c.n_vocab = n_vocab, c.n_ctx_train = 256, c.rope_dim = 16;
    d.model_name = "tiny";
    d.chat_max_tokens = 64;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Setup s;
  const std::string_view body = lp::fuzz::as_text(data, size);
  for (const lp::server::Endpoint e :
       {lp::server::Endpoint::Completions, lp::server::Endpoint::ChatCompletions}) {
    try {
      const lp::server::ApiRequest r = lp::server::parse_request(body, e, *s.tok, s.c, s.d, 7);
      if (r.prompt.empty() || int64_t(r.prompt.size()) + r.max_tokens > s.c.n_ctx_train || r.max_tokens < 1)
        std::abort();  // accepted what the engine cannot hold
      if (!std::isfinite(r.sampler.temperature) || r.sampler.temperature < 0 || !(r.sampler.top_p > 0) ||
          r.sampler.top_p > 1)
        std::abort();
      for (const int32_t t : r.prompt)
        if (t < 0 || t >= s.c.n_vocab) std::abort();
    } catch (const lp::server::ApiError& err) {
      if (err.status < 400 || err.status > 499) std::abort();  // a body is the client's fault, or fine
    }
  }
  return 0;
}
