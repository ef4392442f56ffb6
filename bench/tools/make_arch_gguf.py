#!/usr/bin/env python3
"""Random-weight GGUFs shaped like the models people deploy, for speed comparisons with llama.cpp
(bench/compare_llamacpp.py): Qwen3-0.6B and Gemma 3 270M, matrices in Q8_0 (norms f32), a dummy
vocabulary of the real size (one merge, as llama.cpp needs). The weights are noise: only the time of
each op means anything. NOT RUN BY CI (needs gguf-py and numpy):
    /tmp/lcp/bin/python bench/tools/make_arch_gguf.py qwen3-0.6b /tmp/qwen3-0.6b-q8_0.gguf
Shapes from the models' config.json: Qwen3-0.6B 28 layers, 1,024 wide, 16 query and 8 KV heads of
128, FFN 3,072, vocabulary 151,936, tied; Gemma 3 270M 18 layers, 640 wide, 4 query heads and 1 KV
head of 256, FFN 2,048, vocabulary 262,144, tied, window 512 (every sixth layer global);
qwen3-30b-a3b-4l: four layers of Qwen3-30B-A3B (2,048 wide, 32 query and 4 KV heads of 128, 128
experts of width 768, 8 a token; vocabulary 151,936, tied here to keep the file small), 2.7 GB."""
import sys

import numpy as np
import gguf

SHAPES = {
    "qwen3-0.6b": dict(arch="qwen3", L=28, D=1024, H=16, Hkv=8, Dh=128, F=3072, V=151936, window=0),
    "gemma3-270m": dict(arch="gemma3", L=18, D=640, H=4, Hkv=1, Dh=256, F=2048, V=262144, window=512),
    "qwen3-30b-a3b-4l": dict(arch="qwen3moe", L=4, D=2048, H=32, Hkv=4, Dh=128, F=6144, V=151936, window=0,
                             E=128, k=8, Fe=768),
}


def main():
    name, path = sys.argv[1], sys.argv[2]
    s = SHAPES[name]
    arch, L, D, H, Hkv, Dh, F, V = s["arch"], s["L"], s["D"], s["H"], s["Hkv"], s["Dh"], s["F"], s["V"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"random {name}")
    w.add_context_length(32768)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    if s["window"]:
        w.add_sliding_window(s["window"])
    E = s.get("E", 0)
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(s["k"])
        w.add_expert_feed_forward_length(s["Fe"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(V - 3)])
    w.add_token_types([1] * V)
    w.add_token_merges(["a b"])

    def mat(tname, rows, cols, scale, n=1):  # n > 1: n stacked [rows][cols] matrices (experts)
        shape = (n, rows, cols) if n > 1 else (rows, cols)
        a = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
        w.add_tensor(tname, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vec(tname, n):
        w.add_tensor(tname, np.ones(n, dtype=np.float32))

    mat("token_embd.weight", V, D, 0.05)
    vec("output_norm.weight", D)
    for l in range(L):
        p = f"blk.{l}."
        vec(p + "attn_norm.weight", D)
        mat(p + "attn_q.weight", H * Dh, D, D ** -0.5)
        mat(p + "attn_k.weight", Hkv * Dh, D, D ** -0.5)
        mat(p + "attn_v.weight", Hkv * Dh, D, D ** -0.5)
        mat(p + "attn_output.weight", D, H * Dh, (H * Dh) ** -0.5)
        vec(p + "attn_q_norm.weight", Dh)
        vec(p + "attn_k_norm.weight", Dh)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", D)
            vec(p + "post_ffw_norm.weight", D)
        vec(p + "ffn_norm.weight", D)
        if E:
            Fe = s["Fe"]
            w.add_tensor(p + "ffn_gate_inp.weight",
                         rng.standard_normal((E, D), dtype=np.float32) * np.float32(D ** -0.5))
            mat(p + "ffn_gate_exps.weight", Fe, D, D ** -0.5, E)
            mat(p + "ffn_up_exps.weight", Fe, D, D ** -0.5, E)
            mat(p + "ffn_down_exps.weight", D, Fe, Fe ** -0.5, E)
            continue
        mat(p + "ffn_gate.weight", F, D, D ** -0.5)
        mat(p + "ffn_up.weight", F, D, D ** -0.5)
        mat(p + "ffn_down.weight", D, F, F ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(path)


if __name__ == "__main__":
    main()
