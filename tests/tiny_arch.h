// Test utility: the tiny GGUF files of the architectures after Llama (qwen2, qwen3, gemma3, qwen3moe,
// Mixtral-style llama MoE) that llama.cpp's reference logits were computed on.
//
// tests/fixtures/arch/make_tiny_arch.py writes them with gguf-py and keeps llama.cpp's logits in
// tests/fixtures/arch/<arch>.json; this builds the same files with the project's GGUF writer from the
// same rule: element i of tensor `name` is offset + scale * u, u in [-1, 1) from splitmix64 of
// (FNV-1a(name) << 32 | i), exact in float32 (the script's weight()). The fixture's sha256 of the
// tensors' bytes says whether the two agree (TinyArch.FilesAreTheOnesLlamaCppRan).
#pragma once

#include <string>
#include <vector>

#include "tests/gguf_writer.h"

namespace lp::testing {

// The architectures with a fixture, by the fixture's name ("mixtral" is general.architecture "llama"
// with experts).
const std::vector<std::string>& tiny_archs();

// The writer of tiny-<arch>.gguf: matrices in F32 or, with q8_0, in Q8_0 (norms, biases and routers
// stay F32, as llama.cpp's quantizer leaves them). sha256 (if not null) receives the hex digest of
// every tensor's bytes in file order, the fixture's tensors_sha256.
GgufWriter tiny_arch_writer(const std::string& arch, bool q8_0, std::string* sha256 = nullptr);

// The script's weight(name, n, scale, offset).
std::vector<float> tiny_arch_weight(const std::string& name, int64_t n, float scale, float offset);

}  // namespace lp::testing
