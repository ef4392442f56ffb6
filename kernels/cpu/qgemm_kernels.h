// The integer GEMM's kernels as its dispatcher (qgemm.cpp) calls them: one namespace per
// instruction set, each defined in a file of its own compiled for that set's target
// (qgemm_avx2.cpp, qgemm_avx512.cpp) and called only where the CPU runs it (qkernel_supported).
// Internal to kernels/cpu/. The kernels allocate nothing: the dispatcher takes each task's working
// memory from its context's per-thread scratch (CpuContext::scratch), sized by the *_scratch
// functions here, and passes it in.
#pragma once

#include <cstdint>

#include "kernels/cpu/buffer.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/qgemm_blocks.h"

namespace lp {

// qpack's copy (lanes past N are zero), per panel of avx512::kPanel outputs (two vectors j of 16
// lanes), for block b of 32. qgemm_avx512.cpp's PackedPanel reads it as laid out; qgemm_avx2.cpp's
// PackedQuarters reads each 64-byte vector as two 256-bit halves (quarter q = 2j + half: outputs
// 8q..8q + 7), so one copy serves both instruction sets:
// - the simple types: w holds Q8_0's unsigned bytes [nb][kNV][8 groups of 4 elements][16 lanes][4],
//   or Q4_0's and Q4_1's nibbles [nb][kNV][4][64] (groups 2q and 2q + 1 in byte q's low and high
//   halves); d and m their f16 scales and minima [nb][kPanel];
// - the K-quants: one stream a panel, in w, so a decoding step reads each panel front to back: per
//   super-block its f16 d (and dmin) [kPanel] each, then its 8 blocks, each its nibbles as above,
//   the bits above them (Q5_K's fifth bit of group g in bit g of the byte its nibble has, one plane
//   of [kNV][64]; Q6_K's two in bits 2 (g % 4) of plane g / 4, two planes), then its multipliers as
//   bytes [S][kNV][16] (Q6_K's signed) and minima's [kNV][16]. So Q6_K keeps its blocks' bytes, Q4_K
//   and Q5_K 4 bytes more per 256 weights (their 6-bit multipliers as bytes).
//   (Five arrays or one stream a panel measured the same: Q4_K at 60-68% of the read ceiling,
//   BM_QGemv, 2026-11-29; the per-block scale steps bound it, docs/cpu-kernels.md.)
struct QPacked {
  GgmlType type = GgmlType::Q8_0;
  int64_t N = 0, nb = 0, panel_bytes = 0;
  Buffer<uint8_t> w;
  Buffer<uint16_t> d, m;
};

namespace qk {

// A K-quant panel's layout in QPacked::w (bytes).
struct KPanelLayout {
  int64_t head = 0;                // a super-block's d (and dmin)
  int64_t block = 0;               // a block: nibbles, high planes, multipliers (and minima)
  int64_t hi = 0, sc = 0, mn = 0;  // offsets within a block
  int64_t super() const { return head + 8 * block; }
};
constexpr KPanelLayout kpanel_layout(GgmlType t, int lanes, int nv) {
  const int64_t panel = int64_t(lanes) * nv, nib = nv * 4 * 64, hi = nv * high_planes(t) * 64;
  const int64_t sc = n_scales(t) * panel, mn = block_has_min(t) ? panel : 0;
  return {(block_has_min(t) ? 2 : 1) * panel * 2, nib + hi + sc + mn, nib, nib + hi, nib + hi + sc};
}
// Where block b's weights start in a panel as qpack lays it out (a K-quant's: in its super-block,
// after the head; the simple types': Q8_0's bytes or the others' nibbles, block after block).
constexpr int64_t packed_block_offset(GgmlType t, int lanes, int nv, int64_t b) {
  if (is_kquant(t)) {
    const KPanelLayout L = kpanel_layout(t, lanes, nv);
    return (b / 8) * L.super() + L.head + (b % 8) * L.block;
  }
  return b * nv * (t == GgmlType::Q8_0 ? 8 : 4) * 64;
}

// One task's working memory: weights (64-byte aligned), f32 scales and minima, and how many of
// each a kernel needs.
struct Scratchpad {
  uint8_t* w = nullptr;
  float* d = nullptr;
  float* mins = nullptr;
};
struct ScratchSize {
  int64_t weight_bytes = 0, scales = 0, mins = 0;
};

// The 256-bit tiles (one (row, output) pair's block in a vector, its lanes reduced per block): the
// outputs n0..n1 of rows m0..m1, their block scales converted once into the scratch.
// A K-quant's: its integer multipliers (int32) in the scales and minima, its super-blocks' d and
// dmin [outputs][nb / 8][2] after the scales.
static inline ScratchSize tiles_scratch(GgmlType t, int64_t nb, int64_t outputs) {
  return {0, outputs * nb * n_scales(t) + (is_kquant(t) ? outputs * (nb / 8) * 2 : 0),
          block_has_min(t) ? outputs * nb : 0};
}
// Decoding (fewer rows than a panel pays for): the rows over outputs n0..n0 + cnt (cnt <= kGemvOut)
// read where they lie, the K-quants' scales converted once per tile into the scratch (the simple
// types' are read in the loop: none).
inline constexpr int kGemvOut = 8;
// (Theirs are the integer multipliers, int32, then the super-blocks' d and dmin [nb / 8][2][8].)
static inline ScratchSize gemv_scratch(GgmlType t, int64_t nb) {
  if (scales_in_loop(t)) return {};
  return {0, nb * n_scales(t) * kGemvOut + nb / 8 * 2 * kGemvOut, block_has_min(t) ? nb * kGemvOut : 0};
}

// ---- AVX2: vpmaddubsw (u8 x s8 -> pairs of s16) + vpmaddwd ----
namespace avx2 {
inline constexpr int kLanes = 8, kNV = 2, kPanel = kLanes * kNV;
// What a type's weights are offset by in the panels (taken back as -offset x each activation
// block's sum); Q8_0 stays signed (its offset would saturate vpmaddubsw's pairs).
int offset(GgmlType t);
// A panel of kPanel outputs: weights [nb][kNV][8 groups][8 lanes][4 bytes] (Q8_0: then the same
// again as magnitudes), scales [nb][S][kNV][8], minima [nb][kNV][8].
// (A K-quant's scales and minima its integer multipliers, its super-blocks' d and dmin after the
// scales, [nb / 8][2][kNV][8].)
static inline ScratchSize panel_scratch(GgmlType t, int64_t nb) {
  return {(t == GgmlType::Q8_0 ? 2 : 1) * nb * kNV * 8 * 32,
          nb * n_scales(t) * kPanel + (is_kquant(t) ? nb / 8 * 2 * kPanel : 0),
          block_has_min(t) ? nb * kPanel : 0};
}
void tiles(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, int64_t nb, int64_t m0,
           int64_t m1, int64_t n0, int64_t n1, float* C, int64_t ldc, const Scratchpad& s);
// Every row of outputs n0..n0 + cnt (cnt <= kPanel); bias: -offset x the sum of each activation
// block (half for Q6_K), [M][nb][S].
void panel(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
           int64_t nb, int64_t M, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s);
void gemv(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
          int64_t nb, int64_t M, int64_t N, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s);
// Every row over panel p (avx512::kPanel outputs) of a packed matrix: read as packed (fewer than
// kPanelMinRows rows, !wide), else each half of 16 outputs widened into a panel (panel_scratch's
// layout) and multiplied as the per-call panels are. bias as for panel (offset(t)'s).
static inline ScratchSize packed_scratch(const QPacked& P, bool wide) {
  return wide ? panel_scratch(P.type, P.nb) : ScratchSize{};
}
void packed(const QPacked& P, int64_t p, const QActBlock* qa, const int32_t* bias, int64_t M, bool wide,
            float* C, int64_t ldc, const Scratchpad& s);
// Block b of a row as qpack's unsigned bytes (its values plus the type's unsigned_offset, 128 for
// Q8_0), element 4g + i in byte i of groups[g]: what qpack lays out, decoded by the kernels' own
// loads (AVX2 + F16C, which every CPU that packs has).
void unsigned_groups(GgmlType t, const uint8_t* row, int64_t b, uint32_t* groups);
}  // namespace avx2

// ---- AVX-512 VNNI: vpdpbusd (u8 x s8, 4 products summed into each s32 lane) ----
namespace avx512 {
inline constexpr int kLanes = 16, kNV = 2, kPanel = kLanes * kNV;
int offset(GgmlType t);  // the type's unsigned offset (128 for Q8_0)
// A panel of kPanel outputs: weights [nb][kNV][8 groups][16 lanes][4 bytes], scales
// [nb][S][kNV][16], minima [nb][kNV][16] (also a packed panel widened: packed_scratch). A K-quant's
// scales are its integer multipliers (int32), its minima's multipliers two blocks a word (16-bit
// halves, [nb / 8][4][kNV][16]), and its super-blocks' d and dmin follow the scales as f32
// [nb / 8][2][kNV][16].
static inline ScratchSize panel_scratch(GgmlType t, int64_t nb) {
  return {nb * kNV * 8 * 64, nb * n_scales(t) * kPanel + (is_kquant(t) ? nb / 8 * 2 * kPanel : 0),
          block_has_min(t) ? nb * kPanel : 0};
}
// The 256-bit tiles with vpdpbusd (one output's block per vector).
void tiles(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, int64_t nb, int64_t m0,
           int64_t m1, int64_t n0, int64_t n1, float* C, int64_t ldc, const Scratchpad& s);
// The activations as the AMX tile kernel reads them (the dispatcher lays them out): rows m..m + 16
// of block b one contiguous A tile. Mp: M rounded up to kAmxRows, the rows past M zero.
inline constexpr int kAmxRows = 32;
struct TileRows {
  int64_t Mp = 0;
  int8_t* q = nullptr;     // [nb][Mp][32]: the blocks' bytes
  float* d = nullptr;      // [nb][Mp]: their scales
  float* s = nullptr;      // [nb][Mp]: d x their sums
  int32_t* sum = nullptr;  // [nb][Mp]: their sums
};
// amx: the tile kernel over those rows instead of the VNNI panels over qa and bias (calls of
// kPanelMinRows or more, on a CPU where amx_int8_usable()); the same bits.
void panel(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
           int64_t nb, int64_t M, int64_t n0, int cnt, float* C, int64_t ldc, const TileRows* amx,
           const Scratchpad& s);
// Every row over panel p of a packed matrix; wide (many rows): widened once into the scratch.
// (The AMX kernel widens every type, Q8_0 too: its tiles multiply the weights as signed bytes.)
static inline ScratchSize packed_scratch(const QPacked& P, bool wide, bool amx) {
  return (wide && P.type != GgmlType::Q8_0) || amx ? panel_scratch(P.type, P.nb) : ScratchSize{};
}
void packed(const QPacked& P, int64_t p, const QActBlock* qa, const int32_t* bias, int64_t M, bool wide,
            const TileRows* amx, float* C, int64_t ldc, const Scratchpad& s);
void gemv(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
          int64_t nb, int64_t M, int64_t N, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s);
}  // namespace avx512

}  // namespace qk
}  // namespace lp
