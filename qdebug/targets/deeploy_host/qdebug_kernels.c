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
