#!/usr/bin/env python3
"""Seeds for fuzz_gguf: the smallest files of the architectures after Llama (qwen2's biases,
qwen3's q/k norms and key_length, gemma3's window, pattern and post norms, qwen3moe's expert counts,
router and 3-D expert tensors), so the fuzzer starts from inputs that reach their metadata checks;
and two the simulator costs but the engine cannot run (deepseek2's latent attention, shared experts
and dense leading layer in the MQA form llama.cpp's converter writes since 2025; gpt-oss's biases,
sinks and sliding window), which tests/model/test_costing_gguf.cpp also reads as files written by
llama.cpp's own writer. Not run by CI (needs gguf-py; gguf 0.19.0 wrote the files in git):
    /tmp/lcp/bin/python fuzz/corpus/make_arch_seeds.py
writes fuzz/corpus/gguf/tiny-{qwen2,qwen3,gemma3,qwen3moe,deepseek2,gpt-oss}.gguf (2 to 14 KB each)."""
import pathlib

import numpy as np
import gguf

OUT = pathlib.Path(__file__).parent / "gguf"


def make(arch):
    L, D, H, Hkv, Dh, F, V = 2, 4, 2, 1, 4, 8, 4
    w = gguf.GGUFWriter(str(OUT / f"tiny-{arch}.gguf"), arch)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_layer_norm_rms_eps(1e-6)
    E, k = 3, 2
    if arch == "qwen3moe":
        w.add_expert_count(E)
        w.add_expert_used_count(k)
        w.add_expert_feed_forward_length(F)
    if arch == "gemma3":
        w.add_sliding_window(8)
        w.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab", "<s>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    t = lambda name, *shape: w.add_tensor(name, np.full(shape, 0.5, dtype=np.float32))
    t("token_embd.weight", V, D)
    t("output_norm.weight", D)
    for l in range(L):
        p = f"blk.{l}."
        t(p + "attn_norm.weight", D)
        t(p + "attn_q.weight", H * Dh, D)
        t(p + "attn_k.weight", Hkv * Dh, D)
        t(p + "attn_v.weight", Hkv * Dh, D)
        if arch == "qwen2":
            t(p + "attn_q.bias", H * Dh)
            t(p + "attn_k.bias", Hkv * Dh)
            t(p + "attn_v.bias", Hkv * Dh)
        t(p + "attn_output.weight", D, H * Dh)
        if arch != "qwen2":
            t(p + "attn_q_norm.weight", Dh)
            t(p + "attn_k_norm.weight", Dh)
        if arch == "gemma3":
            t(p + "post_attention_norm.weight", D)
            t(p + "post_ffw_norm.weight", D)
        t(p + "ffn_norm.weight", D)
        if arch == "qwen3moe":
            t(p + "ffn_gate_inp.weight", E, D)
            t(p + "ffn_gate_exps.weight", E, F, D)
            t(p + "ffn_up_exps.weight", E, F, D)
            t(p + "ffn_down_exps.weight", E, D, F)
            continue
        t(p + "ffn_gate.weight", F, D)
        t(p + "ffn_up.weight", F, D)
        t(p + "ffn_down.weight", D, F)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_costed(arch):
    """deepseek2: 3 layers (the first dense), 2 heads of 6 (nope 4 + rope 2) with values of 4, query
    latent 4, K/V latent 4, 4 experts of 4 (top 2) and one shared of 4. gpt-oss: 2 layers (the
    first sliding over 8 keys), 4 heads and 2 K/V heads of 2, 4 experts of 4 (top 2), with biases
    and sinks."""
    L, D, F, V, E, k, Fe = 3, 8, 8, 4, 4, 2, 4
    w = gguf.GGUFWriter(str(OUT / f"tiny-{arch}.gguf"), arch)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(k)
    w.add_expert_feed_forward_length(Fe)
    t = lambda name, *shape: w.add_tensor(name, np.full(shape, 0.5, dtype=np.float32))
    t("token_embd.weight", V, D)
    t("output_norm.weight", D)
    t("output.weight", V, D)

    def experts(p, biases):
        t(p + "ffn_gate_inp.weight", E, D)
        t(p + "ffn_gate_exps.weight", E, Fe, D)
        t(p + "ffn_up_exps.weight", E, Fe, D)
        t(p + "ffn_down_exps.weight", E, D, Fe)
        if biases:
            t(p + "ffn_gate_inp.bias", E)
            t(p + "ffn_gate_exps.bias", E, Fe)
            t(p + "ffn_up_exps.bias", E, Fe)
            t(p + "ffn_down_exps.bias", E, D)

    if arch == "deepseek2":
        H, nope, rope, v, ql, kl, S = 2, 4, 2, 4, 4, 4, 4
        w.add_block_count(L)
        w.add_head_count(H)
        w.add_head_count_kv(1)
        w.add_q_lora_rank(ql)
        w.add_kv_lora_rank(kl)
        w.add_key_length(kl + rope)
        w.add_value_length(kl)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
        w.add_rope_dimension_count(rope)
        w.add_leading_dense_block_count(1)
        w.add_expert_shared_count(1)
        w.add_expert_weights_scale(2.5)
        for l in range(L):
            p = f"blk.{l}."
            t(p + "attn_norm.weight", D)
            t(p + "attn_q_a.weight", ql, D)
            t(p + "attn_q_a_norm.weight", ql)
            t(p + "attn_q_b.weight", H * (nope + rope), ql)
            t(p + "attn_kv_a_mqa.weight", kl + rope, D)
            t(p + "attn_kv_a_norm.weight", kl)
            t(p + "attn_k_b.weight", H, kl, nope)
            t(p + "attn_v_b.weight", H, v, kl)
            t(p + "attn_output.weight", D, H * v)
            t(p + "ffn_norm.weight", D)
            if l == 0:
                t(p + "ffn_gate.weight", F, D)
                t(p + "ffn_up.weight", F, D)
                t(p + "ffn_down.weight", D, F)
                continue
            experts(p, False)
            t(p + "exp_probs_b.bias", E)
            t(p + "ffn_gate_shexp.weight", S, D)
            t(p + "ffn_up_shexp.weight", S, D)
            t(p + "ffn_down_shexp.weight", D, S)
    else:
        L, H, Hkv, Dh = 2, 4, 2, 2
        w.add_block_count(L)
        w.add_head_count(H)
        w.add_head_count_kv(Hkv)
        w.add_key_length(Dh)
        w.add_value_length(Dh)
        w.add_rope_dimension_count(Dh)
        w.add_sliding_window(8)
        for l in range(L):
            p = f"blk.{l}."
            t(p + "attn_norm.weight", D)
            t(p + "attn_q.weight", H * Dh, D)
            t(p + "attn_k.weight", Hkv * Dh, D)
            t(p + "attn_v.weight", Hkv * Dh, D)
            t(p + "attn_q.bias", H * Dh)
            t(p + "attn_k.bias", Hkv * Dh)
            t(p + "attn_v.bias", Hkv * Dh)
            t(p + "attn_output.weight", D, H * Dh)
            t(p + "attn_output.bias", D)
            t(p + "attn_sinks.weight", H)
            t(p + "post_attention_norm.weight", D)
            experts(p, True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


for a in ("qwen2", "qwen3", "gemma3", "qwen3moe"):
    make(a)
    print(OUT / f"tiny-{a}.gguf", (OUT / f"tiny-{a}.gguf").stat().st_size, "bytes")
for a in ("deepseek2", "gpt-oss"):
    make_costed(a)
    print(OUT / f"tiny-{a}.gguf", (OUT / f"tiny-{a}.gguf").stat().st_size, "bytes")
