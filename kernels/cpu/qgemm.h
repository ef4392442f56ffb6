// Integer GEMMs over weights kept in their GGUF block format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K; issue 20, docs/cpu-kernels.md, "Quantized GEMMs"). Activations are quantized per
// block of 32 to 8 bits (round to nearest, scale max|x| / 127, as llama.cpp's q8_0 does), each
// (activation block, weight block) pair is an exact integer dot product, and the per-block scales
// are applied in f32. The K-quants (super-blocks of 256 = 8 blocks of 32 with 6-bit or 8-bit
// integer multipliers) take their activations with one scale per super-block instead (llama.cpp's
// q8_K), so each super-block's sub-block sums meet their integer multipliers before any scale:
// sum_j sc_j x dot_j as a chain of f32 multiply-adds (exact products; on AVX-512 a convert and an FMA
// cost less than the two-µop vpmulld of an integer sum), the minima's sum_j mn_j x sum(q_j) in
// integers, and the scales' f32 steps once per 256 weights, not per 32.
//
// Four kernels compute every product, chosen at run time (never assumed from the build): AVX-512
// VNNI (`vpdpbusd`) 512-bit, with 16 outputs across a vector's lanes over weights packed per panel
// of 32 outputs (once at load for every type but Q5_0 and Q5_1: qpack; else per call for 16 rows or more,
// fewer running its 256-bit tiles), and 256-bit; AVX2 (`vpmaddubsw`
// + `vpmaddwd`); and a scalar twin that is kept as the reference. All of them give bitwise the same
// result: per block (per 16-element half for Q6_K, which has a scale for each) the integer dot
// product is exact, and each output is then one f32 sequence, the same in every kernel: a fused
// multiply-add of that sum with the scale d_w * d_a (rounded once) into one accumulator in block
// order, then, for the types with a minimum, the chain of the minimum terms added at the end. So a
// test can compare them exactly. For the K-quants the sequence is per super-block: f = 0, then
// f = fma(dot_j, sc_j, f) for j over its blocks in order (Q6_K's halves, sc signed for Q6_K; the
// operands exact in f32), fused-multiply-added with d_w * d_a (rounded once), then for Q4_K and Q5_K
// the exact integer sum_j mn_j x sum(q_j) with -(dmin_w * d_a).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/context.h"
#include "model/quant.h"

namespace lp {

inline constexpr int64_t kQBlock = 32;  // elements per block of every type here

// One activation block: q = round(x / d) in [-127, 127], d = max|x| / 127 (0 for a zero block),
// s = d * sum(q) (what a simple type's minimum multiplies), sum = sum(q) (what a K-quant's integer
// minimum multiplies); pair, in the even blocks of a super-block (quantize_activations_super only):
// this block's sum and the next's as the low and high 16-bit halves of one word (|sum| <= 32 x 127),
// the operand the K-quant tiles' vpdpwssd multiply their minima pairs by, broadcast from memory
// where building it per tile took three scalar operations and a port-5 broadcast.
struct QActBlock {
  float d = 0, s = 0;
  int32_t sum = 0, pair = 0;
  int8_t q[kQBlock] = {};
};
// Two blocks' activation sums as the low and high 16-bit halves of one word (QActBlock::pair; the
// AMX tiles build theirs from TileRows' sums).
inline int32_t act_sum_pair(int32_t s0, int32_t s1) {
  return int32_t(uint32_t(uint16_t(s0)) | uint32_t(uint16_t(s1)) << 16);
}

// Quantizes K values (a multiple of kQBlock) into K / kQBlock blocks, a scale per block (llama.cpp's
// q8_0): what the simple types multiply.
void quantize_activations(const float* x, int64_t K, QActBlock* out);
// The same with one scale per super-block of kQSuper values (K a multiple of it; llama.cpp's q8_K):
// the 8 blocks of a super-block share d = max|x| / 127 over all 256, so a K-quant's sub-block sums
// combine with their integer multipliers before any scale (qgemm's K-quant arithmetic, above).
inline constexpr int64_t kQSuper = 256;
void quantize_activations_super(const float* x, int64_t K, QActBlock* out);
// What type t multiplies: per super-block for the K-quants (Q4_K, Q5_K, Q6_K), else per block.
void quantize_activations_for(GgmlType t, const float* x, int64_t K, QActBlock* out);

// Quantizes K weights (a multiple of kQBlock) into GGUF Q8_0 blocks (34 bytes: f16 scale
// max|x| / 127, then 32 int8 values round(x / scale)), as llama.cpp's quantizer writes them.
void quantize_q8_0(const float* x, int64_t K, uint8_t* out);
// One row of K weights of type t (any dequantizable type) as Q8_0 blocks: dequantized, then
// quantize_q8_0 (how --dtype int8 holds a type the integer GEMM does not multiply).
void requantize_q8_0(GgmlType t, const uint8_t* row, int64_t K, uint8_t* out);

// Amx: the 512-bit VNNI kernel with its panels of 16 rows or more multiplied as AMX int8 tiles
// (Sapphire Rapids and later, where the OS grants the tiles: amx_int8_usable); the same bits. Not
// best_qkernel's pick: with a scale per 32 weights it measured at par with the VNNI panels
// (BM_QGemmPacked/4 against /3; docs/cpu-kernels.md, "AMX").
// In the order of what they need of the CPU (qkernel_cap compares them so).
enum class QKernel { Scalar, Avx2, Avx512Vnni, Avx512Vnni512, Amx };
const char* qkernel_name(QKernel k);
// This CPU runs it (cpuid, at run time) and ONEDNN_MAX_CPU_ISA, if set, allows it (qkernel_cap).
bool qkernel_supported(QKernel k);
// The highest kernel a value of ONEDNN_MAX_CPU_ISA lets run: oneDNN's own cap, its names read the
// same way (any case), so one variable makes an AVX-512 machine take the AVX2 paths of both (with
// a build for -march=x86-64-v3, LP_MARCH, for the code compiled for the build's target). AVX2
// and AVX512_CORE (no VNNI) stop at Avx2; SSE41 and AVX at Scalar; the AVX-512 VNNI, BF16 and FP16
// levels before AMX. Null, ALL, DEFAULT or a name oneDNN does not know (which it ignores too): Amx,
// no cap.
QKernel qkernel_cap(const char* onednn_max_cpu_isa);
QKernel best_qkernel();  // VNNI (512-bit), else AVX2, else scalar
// The kernel multiplies the panels qpack lays out where a part has them (AVX2, the 512-bit VNNI
// and AMX kernels; the 256-bit VNNI tiles and the scalar twin read the blocks as stored).
bool qkernel_uses_panels(QKernel k);
std::vector<QKernel> supported_qkernels();

// Weight types the integer GEMM multiplies (the rest are dequantized at load).
bool qgemm_supports(GgmlType t);

// The dot product of one weight row (nblocks blocks of type t, as GGUF stores them) with one
// quantized activation row.
float qdot(QKernel k, GgmlType t, const void* w_row, const QActBlock* a, int64_t nblocks);

// C[M][N] (row stride ldc) = A[M][K] (row stride lda, f32) x W^T, W [N][K] in blocks of type t
// (row r at W + r * row bytes). K must be a multiple of kQBlock. Rows of A are quantized once;
// tiles of (row, output) pairs share their loads; every output element is computed the same way
// whatever the tiling, the kernel and the thread count.
void qgemm(CpuContext& ctx, QKernel k, GgmlType t, const float* A, int64_t M, int64_t lda, const void* W,
           int64_t N, int64_t K, float* C, int64_t ldc);

// Consecutive rows of a weight matrix in one block type: `rows` rows of type_bytes(type, K) bytes at
// `data`. A matrix stacked from tensors of different types (Q4_K_M's attn_q, attn_k in Q4_K and
// attn_v in Q6_K) is a list of them.
// packed: the same rows as qpack keeps them, or null; the kernels that use panels multiply them
// instead of data's rows (the others read data).
struct QPacked;
struct QPart {
  GgmlType type = GgmlType::Q8_0;
  int64_t rows = 0;
  const uint8_t* data = nullptr;
  const QPacked* packed = nullptr;
};

// N rows of K weights of type t (GGUF blocks at W) copied once into the order the 512-bit kernel
// multiplies them in: outputs across a vector's lanes in panels of 32, Q4_0 and Q4_1 kept as
// nibbles and Q8_0 as bytes, the scales in their f16 (so as many bytes as the file's blocks, and
// the same products bit for bit). The AVX2 kernel reads the same panels 8 lanes at a time. Null
// where this CPU has no AVX2 (with FMA and F16C) or the type has no packed form (the GEMM then
// packs per call, or, for fewer than 16 rows, reads the blocks as stored). Decoding reads each
// panel front to back, one stream, instead of 8 rows' blocks side by side reduced per block.
std::shared_ptr<const QPacked> qpack(CpuContext& ctx, GgmlType t, const uint8_t* W, int64_t N, int64_t K);
int64_t qpacked_bytes(const QPacked& p);
// The rows one pass of qgemm quantizes and multiplies: all M, or (when M rows' quantized
// activations exceed a third of cache_bytes, the last-level cache) as many as fit it, in whole
// 48-row tiles, the passes evened out.
int64_t qgemm_pass_rows(int64_t M, int64_t K, int64_t cache_bytes);
// The same over parts, their outputs side by side in C (part i's first output after the rows of
// parts 0..i-1); A is quantized once per pass. Each output is what the single-part qgemm gives.
void qgemm(CpuContext& ctx, QKernel k, const float* A, int64_t M, int64_t lda, std::span<const QPart> parts,
           int64_t K, float* C, int64_t ldc);

}  // namespace lp
