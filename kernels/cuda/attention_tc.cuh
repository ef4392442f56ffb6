// Attention on the tensor cores (issue 58): FlashAttention-2's scheme with f16 operands and f32
// accumulation, over the same key sets as attention_kernel (contiguous or gathered keys, the causal mask
// on original positions, sliding windows, GQA) and the same key splits (flash-decoding), whose partial
// results attention_combine_kernel merges.
//
// A block of 4 warps takes 64 query rows of one KV head (row i of KV head g: token i / G, query head
// g * G + i % G, so a GQA group's rows share each K/V tile); each warp 16 of them, whose Q stays in
// registers as mma A fragments (kernels/cuda/mma.cuh) for the whole pass, scaled by the logits' scale
// before it is rounded to f16 (a query past f16's range would otherwise overflow). Per tile of kTcKeys
// keys: the positions (a tile every key of which comes after every query of the block is skipped), K
// rows into shared memory as f16 ([key][dim]) and V transposed ([dim][key]), so that both products read
// their B fragments as 32-bit pairs (an f16 cache's values as they are, an f32 cache's rounded); S = Q K^T
// by mma (16 x kTcKeys per warp, in registers), the mask, the online softmax per row across the four
// lanes that hold it (two xor shuffles), P rounded to f16 straight from S's accumulators into A
// fragments, and O = alpha O + P V by mma. The row sums l are
// taken from the unrounded weights, as FlashAttention-2 does. Head widths up to 16 * DK (DK = 4, 8 or
// 16); columns past Dh are zeros in Q, K and V and never written.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/mma.cuh"

namespace lp::cuda::kernels {

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;  // query rows of a block
constexpr int kTcKeys = 64;             // keys of a tile

// Row strides of the shared tiles, in f16 values: padded by 8 (16 bytes) so that the eight rows one mma
// reads fall in different banks.
constexpr int tc_ld_k(int DK) {
  return 16 * DK + 8;
}
constexpr int tc_ld_v() {
  return kTcKeys + 8;
}

// The shared memory of attention_tc_kernel<DK>, in bytes.
inline size_t attention_tc_shared_bytes(int DK) {
  return size_t(kTcKeys * tc_ld_k(DK) + 16 * DK * tc_ld_v()) * 2 + size_t(kTcRows + kTcKeys) * 4;
}

// A cached K or V value as f16 bits: an f16 cache's as it is, an f32 cache's rounded to nearest even.
__device__ __forceinline__ uint16_t as_f16(float x) {
  return cm::f32_to_f16(x);
}
__device__ __forceinline__ uint16_t as_f16(uint16_t h) {
  return h;
}

// Two f16 at p (4-byte aligned) as one mma register.
__device__ __forceinline__ uint32_t pair_at(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
#endif
}

// Dims d and d + 1 (d even) of a cached K or V row as one f16 pair, zeros past Dh: an f16 cache's
// in one 32-bit load where both lie in the row (an even Dh keeps every row 4-byte aligned).
template <class KV>
__device__ __forceinline__ uint32_t kv_pair(const KV* row, int d, int64_t Dh) {
  if constexpr (std::is_same_v<KV, uint16_t>)
    if ((Dh & 1) == 0 && d + 1 < Dh) return pair_at(row + d);
  const uint16_t a = d < Dh ? as_f16(row[d]) : uint16_t(0), b = d + 1 < Dh ? as_f16(row[d + 1]) : uint16_t(0);
  return uint32_t(a) | (uint32_t(b) << 16);
}

template <int DK, class KV>
__global__ void __launch_bounds__(kTcThreads)
    attention_tc_kernel(AttnJob one, const AttnJob* jobs, int n_jobs, int64_t H, int64_t Hkv, int64_t Dh,
                        float scale, int32_t window) {
  constexpr int ldk = tc_ld_k(DK), ldv = tc_ld_v(), NJ = kTcKeys / 8, DJ = 2 * DK;
  const BlockJob B = block_job(one, jobs, n_jobs);
  if (B.none) return;
  const auto& [q, q_pos, T, k_any, v_any, k_pos, k_slot, S, out, part_acc, part_m, part_l, tiles_per_split,
               n_splits, n_row_blocks, first_block, first_row] = B.job;
  const KV *k = static_cast<const KV*>(k_any), *v = static_cast<const KV*>(v_any);
  const int64_t G = H / Hkv, g_head = blockIdx.y, split = blockIdx.z, rows = T * G,
                row0 = B.row_block * kTcRows;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  LP_DYNAMIC_SHARED(uint16_t, smem);
  uint16_t* ks = smem;                                           // [kTcKeys][ldk]
  uint16_t* vt = ks + kTcKeys * ldk;                             // [16 DK][ldv]
  int32_t* qp = reinterpret_cast<int32_t*>(vt + 16 * DK * ldv);  // [kTcRows]
  int32_t* kp = qp + kTcRows;                                    // [kTcKeys]

  // This thread's two rows (g and g + 8 of its warp's 16) and their query rows in q.
  const int r_local[2] = {16 * warp + g, 16 * warp + g + 8};
  int64_t q_row[2];
  for (int h = 0; h < 2; ++h) {
    const int64_t i = row0 + r_local[h];
    q_row[h] = i < rows ? (i / G) * H + g_head * G + i % G : -1;
  }
  if (tid < kTcRows) {
    const int64_t i = row0 + tid;
    qp[tid] = i < rows ? q_pos[i / G] : -1;  // a padding row sees no key
  }
  // Q times the scale as A fragments: chunk c holds dims 16c .. 16c + 15.
  uint32_t qa[DK][4];
  LP_UNROLL
  for (int c = 0; c < DK; ++c) {
    float x[2][4];  // [row][dims 2t, 2t + 1, 2t + 8, 2t + 9]
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 4; ++e) {
        const int64_t d = 16 * c + 2 * t + (e / 2) * 8 + e % 2;
        x[h][e] = q_row[h] >= 0 && d < Dh ? q[q_row[h] * Dh + d] * scale : 0.0f;
      }
    qa[c][0] = pack_f16x2(x[0][0], x[0][1]);
    qa[c][1] = pack_f16x2(x[1][0], x[1][1]);
    qa[c][2] = pack_f16x2(x[0][2], x[0][3]);
    qa[c][3] = pack_f16x2(x[1][2], x[1][3]);
  }
  __syncthreads();
  int32_t q_last = -1;
  for (int r = 0; r < kTcRows; ++r) q_last = qp[r] > q_last ? qp[r] : q_last;
  const int32_t my_pos[2] = {qp[r_local[0]], qp[r_local[1]]};

  cm::OnlineSoftmax st[2];
  float o[DJ][4] = {};  // O: dims 8j + 2t, 8j + 2t + 1 of rows g (0, 1) and g + 8 (2, 3)
  const int64_t n_tiles = (S + kTcKeys - 1) / kTcKeys;
  const int64_t tile_end = (split + 1) * tiles_per_split < n_tiles ? (split + 1) * tiles_per_split : n_tiles;
  for (int64_t tile = split * tiles_per_split; tile < tile_end; ++tile) {
    const int64_t s0 = tile * kTcKeys;
    const int n = S - s0 < kTcKeys ? int(S - s0) : kTcKeys;
    if (tile_all_masked<kTcKeys>(kp, k_pos, k_slot, s0, n, q_last)) {
      __syncthreads();  // before the next tile's positions overwrite these
      continue;
    }
    // K as [key][dim] and V as [dim][key], both f16, zeros past the tile's keys and past Dh.
    for (int e = tid; e < kTcKeys * 8 * DK; e += kTcThreads) {
      const int key = e / (8 * DK), d = 2 * (e % (8 * DK));
      uint32_t kk = 0, vv = 0;  // +0 in f16
      if (key < n) {
        const int64_t base = (key_row(k_slot, s0 + key) * Hkv + g_head) * Dh;
        kk = kv_pair(k + base, d, Dh);
        vv = kv_pair(v + base, d, Dh);
      }
      memcpy(ks + key * ldk + d, &kk, 4);
      vt[d * ldv + key] = uint16_t(vv);
      vt[(d + 1) * ldv + key] = uint16_t(vv >> 16);
    }
    __syncthreads();

    // S = Q K^T: keys 8j .. 8j + 7 in s[j].
    float s[NJ][4] = {};
    LP_UNROLL
    for (int j = 0; j < NJ; ++j) {
      const uint16_t* kr = ks + (8 * j + g) * ldk + 2 * t;
      LP_UNROLL
      for (int c = 0; c < DK; ++c) {
        const uint32_t b[2] = {pair_at(kr + 16 * c), pair_at(kr + 16 * c + 8)};
        mma_f16_16816(s[j], qa[c], b);
      }
    }
    // Mask (the scale is in Q), and the online softmax of each of the thread's two rows over the tile.
    float mx[2] = {-INFINITY, -INFINITY};
    LP_UNROLL
    for (int j = 0; j < NJ; ++j) LP_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int key = 8 * j + 2 * t + e % 2, h = e / 2;
      s[j][e] = key < n && cm::visible(kp[key], my_pos[h], window) ? s[j][e] : -INFINITY;
      mx[h] = fmaxf(mx[h], s[j][e]);
    }
    float alpha[2], sum[2] = {0, 0};
    LP_UNROLL
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      alpha[h] = cm::online_rescale(st[h], mx[h]);
    }
    LP_UNROLL
    for (int j = 0; j < NJ; ++j) LP_UNROLL
    for (int e = 0; e < 4; ++e) {
      s[j][e] = cm::online_weight(st[e / 2], s[j][e]);
      sum[e / 2] += s[j][e];
    }
    LP_UNROLL
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
      st[h].l += sum[h];
    }
    LP_UNROLL
    for (int j = 0; j < DJ; ++j) {
      o[j][0] *= alpha[0], o[j][1] *= alpha[0];
      o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    }
    // O += P V: keys 16c .. 16c + 15 of P are S's chunks 2c and 2c + 1, already in A's layout.
    LP_UNROLL
    for (int c = 0; c < kTcKeys / 16; ++c) {
      const uint32_t pa[4] = {pack_f16x2(s[2 * c][0], s[2 * c][1]), pack_f16x2(s[2 * c][2], s[2 * c][3]),
                              pack_f16x2(s[2 * c + 1][0], s[2 * c + 1][1]),
                              pack_f16x2(s[2 * c + 1][2], s[2 * c + 1][3])};
      LP_UNROLL
      for (int j = 0; j < DJ; ++j) {
        const uint16_t* vr = vt + (8 * j + g) * ldv + 16 * c + 2 * t;
        const uint32_t b[2] = {pair_at(vr), pair_at(vr + 8)};
        mma_f16_16816(o[j], pa, b);
      }
    }
    __syncthreads();  // every warp is done with the tile before the next one overwrites it
  }

  LP_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int64_t r = q_row[h];
    if (r < 0) continue;
    LP_UNROLL
    for (int j = 0; j < DJ; ++j)
      for (int e = 0; e < 2; ++e) {
        const int64_t d = 8 * j + 2 * t + e;
        if (d >= Dh) continue;
        const float a = o[j][2 * h + e];
        if (part_acc)
          part_acc[(split * T * H + r) * Dh + d] = a;
        else
          out[r * Dh + d] = cm::online_finish(st[h], a);
      }
    if (part_acc && t == 0) {
      part_m[split * T * H + r] = st[h].m;
      part_l[split * T * H + r] = st[h].l;
    }
  }
}

}  // namespace lp::cuda::kernels
