/*
 * qdebug's host implementations of the Deeploy Generic integer kernels declared in DeeployBasicMath.h.
 *
 * Written for qdebug from the semantics Deeploy documents for its integer operators (RequantShift, integer
 * Conv / depth-wise Conv / Gemm / MatMul accumulating in int32, MaxPool) and from the argument lists its
 * code generator emits; the arithmetic is the device's: int32 accumulators that wrap (built with -fwrapv),
 * arithmetic right shifts, and narrowing casts where the generated code's parameter types narrow. That is
 * deliberate: a parameter the generated code passes out of range must misbehave here as it would on the
 * device, so that running the code exposes it.
 *
 * Part of qdebug (Apache-2.0). Not Deeploy's code.
 */
#include "DeeployBasicMath.h"

/* One requantized value: ((x + in_off) * mul + add [+ half]) >> log2D, + out_off, saturated, as int8. */
static inline int8_t qd_requant(int32_t x, int32_t in_off, int32_t mul, int32_t add, int32_t log2D, int32_t out_off,
                                int8_t lo, int8_t hi, bool rounding) {
  int32_t acc = (x + in_off) * mul + add;
  if (rounding && log2D > 0) {
    acc += (int32_t)1 << (log2D - 1);
  }
  int32_t y = (acc >> log2D) + out_off;
  return (int8_t)QD_SATURATE(y, (int32_t)lo, (int32_t)hi);
}

/* NCHW: the channel of element i is i / HW; NHWC: i % channels. */
#define QD_DEFINE_REQUANT(TIN, SIN)                                                                            \
  void RequantShift_##SIN##_s8_NCHW(TIN *data_in, int32_t size, int32_t *mul, int32_t *add, int8_t *data_out, \
                                    int32_t log2D, int32_t HW, int32_t input_offset, int32_t output_offset,  \
                                    int8_t output_min, int8_t output_max, bool rounding) {                   \
    for (int32_t i = 0; i < size; ++i) {                                                                       \
      int32_t c = i / HW;                                                                                      \
      data_out[i] = qd_requant((int32_t)data_in[i], input_offset, mul[c], add[c], log2D, output_offset,        \
                               output_min, output_max, rounding);                                              \
    }                                                                                                          \
  }                                                                                                            \
  void RequantShift_##SIN##_s8_NHWC(TIN *data_in, int32_t size, int32_t *mul, int32_t *add, int8_t *data_out, \
                                    int32_t log2D, int32_t channels, int32_t input_offset,                   \
                                    int32_t output_offset, int8_t output_min, int8_t output_max,             \
                                    bool rounding) {                                                           \
    for (int32_t i = 0; i < size; ++i) {                                                                       \
      int32_t c = i % channels;                                                                                \
      data_out[i] = qd_requant((int32_t)data_in[i], input_offset, mul[c], add[c], log2D, output_offset,        \
                               output_min, output_max, rounding);                                              \
    }                                                                                                          \
  }
QD_DEFINE_REQUANT(int8_t, s8)
QD_DEFINE_REQUANT(int16_t, s16)
QD_DEFINE_REQUANT(int32_t, s32)

/* Output size of a valid (unpadded) window: the generated code pads into a separate buffer first. */
static inline uint32_t qd_out_dim(uint32_t in, uint32_t k, uint32_t stride) { return (in - k) / stride + 1; }

/* Dot product of one P x Q window of one input channel plane with one P x Q kernel plane. */
static int32_t qd_window(int8_t const *plane, uint32_t W, uint32_t y0, uint32_t x0, int8_t const *kernel, uint32_t P,
                         uint32_t Q, int32_t input_offset) {
  int32_t acc = 0;
  for (uint32_t p = 0; p < P; ++p) {
    int8_t const *row = plane + (y0 + p) * W + x0;
    for (uint32_t q = 0; q < Q; ++q) {
      acc += ((int32_t)row[q] + input_offset) * (int32_t)kernel[p * Q + q];
    }
  }
  return acc;
}

void Conv2d_s8_s8_s32_NCHW(int8_t const *pSrcA, uint32_t C, uint32_t H, uint32_t W, int8_t const *pSrcB,
                           uint32_t F, uint32_t P, uint32_t Q, uint32_t SP, uint32_t SQ, int32_t *pDstC,
                           int32_t input_offset, int32_t output_offset) {
  uint32_t Ho = qd_out_dim(H, P, SP), Wo = qd_out_dim(W, Q, SQ);
  for (uint32_t f = 0; f < F; ++f) {
    for (uint32_t y = 0; y < Ho; ++y) {
      for (uint32_t x = 0; x < Wo; ++x) {
        int32_t acc = 0;
        for (uint32_t c = 0; c < C; ++c) {
          acc += qd_window(pSrcA + c * H * W, W, y * SP, x * SQ, pSrcB + (f * C + c) * P * Q, P, Q, input_offset);
        }
        pDstC[(f * Ho + y) * Wo + x] = acc + output_offset;
      }
    }
  }
}

void DWConv2d_s8_s8_s32_NCHW(int8_t const *pSrcA, uint32_t C, uint32_t H, uint32_t W, int8_t const *pSrcB,
                             uint32_t P, uint32_t Q, uint32_t SP, uint32_t SQ, int32_t *pDstC,
                             int32_t input_offset, int32_t output_offset) {
  uint32_t Ho = qd_out_dim(H, P, SP), Wo = qd_out_dim(W, Q, SQ);
  for (uint32_t c = 0; c < C; ++c) {
    for (uint32_t y = 0; y < Ho; ++y) {
      for (uint32_t x = 0; x < Wo; ++x) {
        int32_t acc = qd_window(pSrcA + c * H * W, W, y * SP, x * SQ, pSrcB + c * P * Q, P, Q, input_offset);
        pDstC[(c * Ho + y) * Wo + x] = acc + output_offset;
      }
    }
  }
}

/* Y[m,p] = alpha * sum_n (A'[m,n] + A_off)(B'[n,p] + B_off) + beta * (C[m,p] + C_off) + Y_off, with A' (M x N)
 * stored transposed when transA and B' (N x P) when transB. */
void Gemm_s8_s8_s32_s32(int8_t const *pSrcA, int8_t const *pSrcB, int32_t const *pSrcC, int32_t *pDstY,
                        uint32_t M, uint32_t N, uint32_t P, int32_t alpha, int32_t beta, int32_t transA,
                        int32_t transB, int32_t A_offset, int32_t B_offset, int32_t C_offset, int32_t Y_offset) {
  for (uint32_t m = 0; m < M; ++m) {
    for (uint32_t p = 0; p < P; ++p) {
      int32_t acc = 0;
      for (uint32_t n = 0; n < N; ++n) {
        int32_t a = pSrcA[transA ? n * M + m : m * N + n];
        int32_t b = pSrcB[transB ? p * N + n : n * P + p];
        acc += (a + A_offset) * (b + B_offset);
      }
      pDstY[m * P + p] = alpha * acc + beta * (pSrcC[m * P + p] + C_offset) + Y_offset;
    }
  }
}

/* C[m,p] = C_off + sum_n (A[m,n] + A_off)(B[n,p] + B_off); A is M x N, B is N x P, row-major. */
void MatMul_s8_s8_s32(int8_t const *pSrcA, int8_t const *pSrcB, int32_t *pDstC, uint32_t M, uint32_t N, uint32_t P,
                      int32_t A_offset, int32_t B_offset, int32_t C_offset) {
  for (uint32_t m = 0; m < M; ++m) {
    for (uint32_t p = 0; p < P; ++p) {
      int32_t acc = C_offset;
      for (uint32_t n = 0; n < N; ++n) {
        acc += ((int32_t)pSrcA[m * N + n] + A_offset) * ((int32_t)pSrcB[n * P + p] + B_offset);
      }
      pDstC[m * P + p] = acc;
    }
  }
}

/* The maximum of (x + in_off) over each valid window, starting from the int8 minimum, plus out_off, as int8. */
void MaxPool2d_s8_s8_NCHW(int8_t const *pSrcA, uint32_t C, uint32_t H, uint32_t W, uint32_t P, uint32_t Q,
                          uint32_t SP, uint32_t SQ, int8_t *pDstC, int32_t input_offset, int32_t output_offset) {
  uint32_t Ho = qd_out_dim(H, P, SP), Wo = qd_out_dim(W, Q, SQ);
  for (uint32_t c = 0; c < C; ++c) {
    int8_t const *plane = pSrcA + c * H * W;
    for (uint32_t y = 0; y < Ho; ++y) {
      for (uint32_t x = 0; x < Wo; ++x) {
        int32_t best = INT8_MIN;
        for (uint32_t p = 0; p < P; ++p) {
          for (uint32_t q = 0; q < Q; ++q) {
            int32_t v = (int32_t)plane[(y * SP + p) * W + x * SQ + q] + input_offset;
            best = v > best ? v : best;
          }
        }
        pDstC[(c * Ho + y) * Wo + x] = (int8_t)(best + output_offset);
      }
    }
  }
}

/* ---- Transformer kernels ---------------------------------------------------------------------------------- */

/* Integer square root by bisection over [0, 46342] (46342^2 just exceeds INT32_MAX): the exact root of a perfect
 * square, else the largest r whose square (int32) is below n; 0 for n <= 0. */
static int32_t qd_isqrt(int32_t n) {
  if (n <= 0) {
    return 0;
  }
  int32_t lo = 0, hi = 46342, root = 0;
  while (lo <= hi) {
    int32_t mid = (lo + hi) >> 1;
    int32_t sq = mid * mid;
    if (sq == n) {
      return mid;
    }
    if (sq < n) {
      root = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return root;
}

/* Per row of lastDimLength: mean and variance in integers (C division truncates), std = isqrt(var + 1), then
 * y = (int8)((((x - mean) * weight[j]) / std + bias[j]) >> log2D) in 64-bit, no saturation. */
void Layernorm_s8_s8(int8_t *data_in, int8_t *data_out, int32_t *weight, int32_t *bias, int32_t input_offset,
                     int32_t size, int32_t lastDimLength, int32_t log2D) {
  for (int32_t start = 0; start < size; start += lastDimLength) {
    int8_t const *x = data_in + start;
    int32_t mean = 0;
    for (int32_t j = 0; j < lastDimLength; ++j) {
      mean += (int32_t)x[j] + input_offset;
    }
    mean /= lastDimLength;
    int32_t var = 0;
    for (int32_t j = 0; j < lastDimLength; ++j) {
      int16_t centred = (int16_t)((int32_t)x[j] + input_offset - mean);
      var += (int32_t)centred * (int32_t)centred;
    }
    var = var / lastDimLength + 1;
    int64_t std = qd_isqrt(var);
    for (int32_t j = 0; j < lastDimLength; ++j) {
      int64_t centred = (int64_t)x[j] + input_offset - mean;
      data_out[start + j] = (int8_t)(((centred * weight[j]) / std + bias[j]) >> log2D);
    }
  }
}

/* Per row: p = x - max split as p = -z*log2 + r (z saturated to [0, 31]), exp(r) ~ coeffA*(r + coeffB)^2 + coeffC,
 * y = that >> z (unsigned), out = (int8)(y * (n_levels - 1) / sum(y) - n_levels / 2) in uint32 arithmetic. */
void Softmax_s8_s8(int8_t *data_in, int8_t *data_out, uint32_t size, uint32_t lastDimLength, int32_t coeffA,
                   int32_t coeffB, int64_t coeffC, int32_t log2, uint32_t n_levels) {
  uint32_t *y = (uint32_t *)malloc(sizeof(uint32_t) * lastDimLength);
  for (uint32_t row = 0; row < size / lastDimLength; ++row) {
    int8_t const *x = data_in + row * lastDimLength;
    int8_t top = INT8_MIN;
    for (uint32_t j = 0; j < lastDimLength; ++j) {
      top = x[j] > top ? x[j] : top;
    }
    uint32_t total = 0;
    for (uint32_t j = 0; j < lastDimLength; ++j) {
      int16_t diff = (int16_t)(x[j] - top);
      int8_t z = (int8_t)(-(diff / log2));
      z = (int8_t)QD_SATURATE(z, 0, 31);
      int16_t r = (int16_t)(diff + z * log2);
      int32_t poly = coeffA * ((r + coeffB) * (r + coeffB));
      y[j] = (uint32_t)((uint64_t)((int64_t)poly + coeffC) >> z);
      total += y[j];
    }
    for (uint32_t j = 0; j < lastDimLength; ++j) {
      data_out[row * lastDimLength + j] = (int8_t)((y[j] * (n_levels - 1)) / total - n_levels / 2);
    }
  }
  free(y);
}

/* i-GELU: x * (one + L(x)) / 2 with L the clipped second-order erf polynomial sign(x)*(one - (min(|x|, -b) + b)^2),
 * then requantized: sat(((y * mul + add + 2^(shift-1)) >> shift) + out_off) to int8. */
void RQGELU_s8_s8(int8_t *data_in, int8_t *data_out, int32_t dataSize, int8_t b, int16_t one, int32_t input_offset,
                  int32_t output_offset, int32_t *mul, int32_t *add, int32_t *shift) {
  for (int32_t i = 0; i < dataSize; ++i) {
    int32_t x = (int32_t)data_in[i] + input_offset;
    int32_t sign = (x > 0) - (x < 0);
    int32_t magnitude = sign * x;
    int32_t clipped = magnitude > -b ? -b : magnitude;
    int32_t d = clipped + b;
    int32_t erf_poly = sign * (one - d * d);
    int32_t y = x * ((one + erf_poly) >> 1);
    int32_t acc = y * (*mul) + (*add);
    acc = ((acc + (1 << ((*shift) - 1))) >> (*shift)) + output_offset;
    data_out[i] = (int8_t)QD_SATURATE(acc, -128, 127);
  }
}
