// Reads tokenizer.ggml.* metadata into VocabData (the tokenizer itself knows nothing of GGUF).
#pragma once

#include "model/tokenizer.h"

namespace lp {

class GgufFile;

// Throws lp::Error for missing or inconsistent tokenizer metadata.
VocabData vocab_from_gguf(const GgufFile& f);

}  // namespace lp
