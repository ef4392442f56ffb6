// Vector helpers shared by the CPU kernels: a polynomial exp on 16 (AVX-512), 8 (AVX2 + FMA) or 1
// lanes, and the AVX2 horizontal reductions. Internal to kernels/cpu/; which vector path is compiled
// follows the target's instruction set (-march), and each has the scalar exp1 beside it.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <utility>

// exp: e^x = 2^n * e^r with n = round(x / ln2), |r| <= ln2/2, e^r by its degree-7 Taylor
// polynomial (truncation error < r^8/8! ~ 5e-9 relative, below float rounding).
namespace lp::simd {

// Calls f(std::integral_constant<int, k>{}) with k = min(n, Max), for n >= 1: a run-time count of
// rows left as a tile's compile-time height.
template <int Max, class F>
inline void with_rows(int n, F&& f) {
  const int k = std::min(n, Max);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((k == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<int, Max>{});
}

constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
constexpr float kLog2e = 1.4426950408889634f;
// Below ln(FLT_MIN) exp is 0, never a subnormal: softmax takes exp of every masked (-inf) logit,
// and a subnormal result costs a microcode assist in each instruction that produces or reads it
// (a LazyLLM decoding step, two thirds of whose held keys are masked, ran its attention 2x slower).
constexpr float kExpMin = -87.33654475f;

#if defined(__AVX512F__)
inline __m512 exp512(__m512 x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));  // -inf stays finite; those lanes are 0 below
  x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n));
}
#elif defined(__AVX2__) && defined(__FMA__)
// The same exp on 8 lanes for AVX2-only CPUs. AVX2 has no scalef: 2^n is applied as 2^a * 2^b
// (a = floor(n / 2), b = n - a, both within the normal exponents for n in [-150, 128]), so p * 2^a
// is exact and only the last product rounds, as ldexp does.
inline __m256 exp256(__m256 x) {
  const __m256 normal = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpMin));
  x = _mm256_min_ps(x, _mm256_set1_ps(89.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i a = _mm256_srai_epi32(ni, 1), b = _mm256_sub_epi32(ni, a);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 two_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
  const __m256 two_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
  return _mm256_and_ps(normal, _mm256_mul_ps(_mm256_mul_ps(p, two_a), two_b));
}
inline float reduce_max256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float reduce_add256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

inline float exp1(float x) {
  if (!(x >= kExpMin)) return x != x ? x : 0.0f;  // NaN stays NaN
  x = std::min(x, 89.0f);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040;
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = std::fma(p, r, c);
  // p * 2^n with n in [-126, 129] as 2^a * 2^b, both normal exponents, as exp256 does: the first
  // product is exact, the second rounds once (ldexp's result; ldexp itself is a libm call).
  const int ni = int(n), a = ni >> 1, b = ni - a;
  return p * std::bit_cast<float>(uint32_t(a + 127) << 23) * std::bit_cast<float>(uint32_t(b + 127) << 23);
}
}  // namespace lp::simd
