/*
 * qdebug's host stand-in for Deeploy's Generic kernel library header.
 *
 * Deeploy's generated Generic code (Network.c / Network.h) includes "DeeployBasicMath.h" and calls integer
 * kernels of Deeploy's C library, which the deeploy-pulp wheel does not carry. This header declares the
 * kernels qdebug implements for the host (qdebug_kernels.c), written from Deeploy's documented operator
 * semantics, so that the generated code compiles and runs with the system C compiler. Only what the
 * generated code uses is here: a kernel it calls that is missing shows up as an undefined reference at link
 * time, which qdebug reports by name.
 *
 * Part of qdebug (Apache-2.0). Not Deeploy's code.
 */
#ifndef QDEBUG_DEEPLOY_HOST_BASIC_MATH_H
#define QDEBUG_DEEPLOY_HOST_BASIC_MATH_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One core on the host: the multi-core section markers of the generated code are no-ops. */
#define BEGIN_SINGLE_CORE
#define END_SINGLE_CORE
#define SINGLE_CORE

/* The generated code allocates its intermediate buffers at run time. */
#define deeploy_malloc(size) malloc(size)
#define deeploy_free(ptr) free(ptr)

/* Saturation as the generated code expects it: the upper bound is tested first. */
#define QD_SATURATE(x, lo, hi) (((x) > (hi)) ? (hi) : (((x) < (lo)) ? (lo) : (x)))

/* ---- RequantShift: y = sat(((x + in_off) * mul[c] + add[c] + round) >> log2D) + out_off ---------------- */
#define QD_DECLARE_REQUANT(TIN, SIN)                                                                           \
  void RequantShift_##SIN##_s8_NCHW(TIN *data_in, int32_t size, int32_t *mul, int32_t *add, int8_t *data_out, \
                                    int32_t log2D, int32_t HW, int32_t input_offset, int32_t output_offset,  \
                                    int8_t output_min, int8_t output_max, bool rounding);                    \
  void RequantShift_##SIN##_s8_NHWC(TIN *data_in, int32_t size, int32_t *mul, int32_t *add, int8_t *data_out, \
                                    int32_t log2D, int32_t channels, int32_t input_offset,                   \
                                    int32_t output_offset, int8_t output_min, int8_t output_max, bool rounding);
QD_DECLARE_REQUANT(int8_t, s8)
QD_DECLARE_REQUANT(int16_t, s16)
QD_DECLARE_REQUANT(int32_t, s32)

/* ---- Convolutions on an already padded NCHW input (valid windows), int32 accumulators ------------------ */
void Conv2d_s8_s8_s32_NCHW(int8_t const *pSrcA, uint32_t C, uint32_t H, uint32_t W, int8_t const *pSrcB,
                           uint32_t F, uint32_t P, uint32_t Q, uint32_t SP, uint32_t SQ, int32_t *pDstC,
                           int32_t input_offset, int32_t output_offset);
void DWConv2d_s8_s8_s32_NCHW(int8_t const *pSrcA, uint32_t C, uint32_t H, uint32_t W, int8_t const *pSrcB,
                             uint32_t P, uint32_t Q, uint32_t SP, uint32_t SQ, int32_t *pDstC,
                             int32_t input_offset, int32_t output_offset);

/* ---- Gemm / MatMul ------------------------------------------------------------------------------------- */
void Gemm_s8_s8_s32_s32(int8_t const *pSrcA, int8_t const *pSrcB, int32_t const *pSrcC, int32_t *pDstY,
                        uint32_t M, uint32_t N, uint32_t P, int32_t alpha, int32_t beta, int32_t transA,
                        int32_t transB, int32_t A_offset, int32_t B_offset, int32_t C_offset, int32_t Y_offset);
void MatMul_s8_s8_s32(int8_t const *pSrcA, int8_t const *pSrcB, int32_t *pDstC, uint32_t M, uint32_t N,
                      uint32_t P, int32_t A_offset, int32_t B_offset, int32_t C_offset);

/* ---- Pooling ------------------------------------------------------------------------------------------- */
void MaxPool2d_s8_s8_NCHW(int8_t const *pSrcA, uint32_t C, uint32_t H, uint32_t W, uint32_t P, uint32_t Q,
                          uint32_t SP, uint32_t SQ, int8_t *pDstC, int32_t input_offset, int32_t output_offset);

/* ---- Transformer kernels (I-BERT style integer approximations, as Deeploy defines them) ---------------- */
void Layernorm_s8_s8(int8_t *data_in, int8_t *data_out, int32_t *weight, int32_t *bias, int32_t input_offset,
                     int32_t size, int32_t lastDimLength, int32_t log2D);
void Softmax_s8_s8(int8_t *data_in, int8_t *data_out, uint32_t size, uint32_t lastDimLength, int32_t coeffA,
                   int32_t coeffB, int64_t coeffC, int32_t log2, uint32_t n_levels);
void RQGELU_s8_s8(int8_t *data_in, int8_t *data_out, int32_t dataSize, int8_t b, int16_t one, int32_t input_offset,
                  int32_t output_offset, int32_t *mul, int32_t *add, int32_t *shift);

#endif /* QDEBUG_DEEPLOY_HOST_BASIC_MATH_H */
