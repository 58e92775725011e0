/* The compiled reduction's kernels in C (qdebug/capture/kernels/c_kernel.py builds this file with the machine's C compiler on
 * first use and loads it with ctypes; qdebug/capture/kernels/numba_kernel.py is the same kernels in numba, used when there is no
 * C compiler).
 *
 * One call reads an activation's three tensors (float reference, pre-Q/DQ, post-Q/DQ) once and gives every sum of
 * qdebug.capture.kernels.reference.reduce_sample: the cumulative comparison (reference vs post), the local one (pre vs post)
 * and the reference's min/max. Sums are float64, accumulated over LANES independent lanes: the lanes are what lets the
 * compiler vectorise the loop without re-associating any one sum (no -ffast-math: NaN and Inf keep IEEE semantics, so
 * a non-finite value makes a sum non-finite and the caller redoes that activation in numpy, which counts them).
 *
 * A post-Q/DQ tensor may be given as the integers its QuantizeLinear wrote (qdebug/capture/dequant.py): its value is
 * then float32(int32(q) - zero_point) * scale, which is what ONNX Runtime's DequantizeLinear computes (the double
 * product of two float32 values is exact; rounding it to float once gives the float32 product; -ffp-contract=off keeps
 * that rounding from being fused into the next operation).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
enum { CUM_SIGNAL, CUM_NOISE, CUM_MAX, LOC_SIGNAL, LOC_NOISE, LOC_MAX, REF_MIN, REF_MAX, SLOTS };

/* The element types a tensor may have (ckernel.py passes these codes). */
enum { F32, F64, U8, I8, U16, I16 };

int qd_abi(void) { return 2; }
int qd_slots(void) { return SLOTS; }

/* v clipped to [lo, hi]; a NaN stays NaN (both comparisons are false). */
static inline double clip(double v, double lo, double hi) {
    v = lo > v ? lo : v;
    return hi < v ? hi : v;
}

/* ONNX Runtime's DequantizeLinear: one float32 product (q - zero_point is exact in float32 for 8- and 16-bit q). */
static inline float dequant(int32_t q, float scale, int32_t zero_point) {
    return (float)(q - zero_point) * scale;
}

static double sum_lanes(const double *x) {
    double s = 0.0;
    for (int l = 0; l < LANES; l++) s += x[l];
    return s;
}

static double max_lanes(const double *x) {
    double m = x[0];
    for (int l = 1; l < LANES; l++) m = x[l] > m ? x[l] : m;
    return m;
}

/* The running sums of both comparisons, per lane. */
typedef struct {
    double cs[LANES], cn[LANES], cm[LANES], ls[LANES], ln[LANES], lm[LANES];
} Both;

/* Both comparisons of one quantized activation in one pass, added into *acc; element i goes to lane i % LANES
 * (the tail, size % LANES elements, to lane 0), so a tensor cut into blocks of a multiple of LANES elements sums
 * exactly as it would whole. */
#define BOTH(NAME, TR, TP)                                                                                       \
    static void NAME(const TR *ref, const TR *pre, const TP *post, int64_t size, double mlo, double mhi,         \
                     double plo, double phi, Both *acc) {                                                       \
        Both A = *acc; /* a local copy: the compiler keeps it in registers */                                   \
        int64_t full = size - size % LANES;                                                                     \
        for (int64_t s = 0; s < full; s += LANES) {                                                             \
            for (int l = 0; l < LANES; l++) {                                                                   \
                double b = clip((double)post[s + l], mlo, mhi);                                                 \
                double a = clip((double)ref[s + l], mlo, mhi);                                                  \
                double p = clip(clip((double)pre[s + l], plo, phi), mlo, mhi);                                  \
                double d = a - b, e = p - b, ad = fabs(d), ae = fabs(e);                                        \
                A.cs[l] += a * a;                                                                               \
                A.cn[l] += d * d;                                                                               \
                A.cm[l] = ad > A.cm[l] ? ad : A.cm[l];                                                          \
                A.ls[l] += p * p;                                                                               \
                A.ln[l] += e * e;                                                                               \
                A.lm[l] = ae > A.lm[l] ? ae : A.lm[l];                                                          \
            }                                                                                                   \
        }                                                                                                       \
        for (int64_t i = full; i < size; i++) {                                                                 \
            double b = clip((double)post[i], mlo, mhi);                                                         \
            double a = clip((double)ref[i], mlo, mhi);                                                          \
            double p = clip(clip((double)pre[i], plo, phi), mlo, mhi);                                          \
            double d = a - b, e = p - b, ad = fabs(d), ae = fabs(e);                                            \
            A.cs[0] += a * a;                                                                                   \
            A.cn[0] += d * d;                                                                                   \
            A.cm[0] = ad > A.cm[0] ? ad : A.cm[0];                                                              \
            A.ls[0] += p * p;                                                                                   \
            A.ln[0] += e * e;                                                                                   \
            A.lm[0] = ae > A.lm[0] ? ae : A.lm[0];                                                              \
        }                                                                                                       \
        *acc = A;                                                                                               \
    }

BOTH(both_f32, float, float)
BOTH(both_f64, double, double)
BOTH(both_f64_f32, double, float)

static void both_out(const Both *A, double *out) {
    out[CUM_SIGNAL] = sum_lanes(A->cs), out[CUM_NOISE] = sum_lanes(A->cn), out[CUM_MAX] = max_lanes(A->cm);
    out[LOC_SIGNAL] = sum_lanes(A->ls), out[LOC_NOISE] = sum_lanes(A->ln), out[LOC_MAX] = max_lanes(A->lm);
}

/* Integers dequantized per block into a float32 buffer (a plain loop the compiler vectorises; converting inside the
 * pass it did not), then the float pass on the block. */
#define BLOCK 2048
#define DEQUANT(NAME, TQ)                                                                                        \
    static void NAME(const void *ref, const void *pre, const TQ *q, int64_t size, int f64, float scale,          \
                     int32_t zero_point, double mlo, double mhi, double plo, double phi, Both *acc) {           \
        float buf[BLOCK];                                                                                       \
        for (int64_t at = 0; at < size; at += BLOCK) {                                                          \
            int64_t len = size - at < BLOCK ? size - at : BLOCK;                                                \
            for (int64_t i = 0; i < len; i++) buf[i] = dequant((int32_t)q[at + i], scale, zero_point);          \
            if (f64)                                                                                            \
                both_f64_f32((const double *)ref + at, (const double *)pre + at, buf, len, mlo, mhi, plo, phi,  \
                             acc);                                                                              \
            else                                                                                                \
                both_f32((const float *)ref + at, (const float *)pre + at, buf, len, mlo, mhi, plo, phi, acc);  \
        }                                                                                                       \
    }

DEQUANT(dequant_u8, uint8_t)
DEQUANT(dequant_i8, int8_t)
DEQUANT(dequant_u16, uint16_t)
DEQUANT(dequant_i16, int16_t)

/* Σa², Σ(a−b)², max|a−b| into out[at..at+2]: a is x clipped to [xlo, xhi] then [lo, hi], b is y clipped to [lo, hi]. */
#define PAIR(NAME, T)                                                                                               \
    static void NAME(const T *x, const T *y, int64_t size, double xlo, double xhi, double lo, double hi,           \
                     double *out) {                                                                                \
        double s[LANES] = {0}, n[LANES] = {0}, m[LANES] = {0};                                                     \
        int64_t full = size - size % LANES;                                                                        \
        for (int64_t st = 0; st < full; st += LANES) {                                                             \
            for (int l = 0; l < LANES; l++) {                                                                      \
                double a = clip(clip((double)x[st + l], xlo, xhi), lo, hi);                                        \
                double b = clip((double)y[st + l], lo, hi);                                                        \
                double d = a - b, ad = fabs(d);                                                                    \
                s[l] += a * a;                                                                                     \
                n[l] += d * d;                                                                                     \
                m[l] = ad > m[l] ? ad : m[l];                                                                      \
            }                                                                                                      \
        }                                                                                                          \
        for (int64_t i = full; i < size; i++) {                                                                    \
            double a = clip(clip((double)x[i], xlo, xhi), lo, hi);                                                 \
            double b = clip((double)y[i], lo, hi);                                                                 \
            double d = a - b, ad = fabs(d);                                                                        \
            s[0] += a * a;                                                                                         \
            n[0] += d * d;                                                                                         \
            m[0] = ad > m[0] ? ad : m[0];                                                                          \
        }                                                                                                          \
        out[0] = sum_lanes(s), out[1] = sum_lanes(n), out[2] = max_lanes(m);                                       \
    }

/* min and max of x ignoring NaN (±Inf included: the caller redoes those) into out[0], out[1]. */
#define RANGE(NAME, T)                                                                                  \
    static void NAME(const T *x, int64_t size, double *out) {                                          \
        T lo[LANES], hi[LANES];                                                                        \
        for (int l = 0; l < LANES; l++) lo[l] = (T)INFINITY, hi[l] = (T)-INFINITY;                      \
        int64_t full = size - size % LANES;                                                            \
        for (int64_t st = 0; st < full; st += LANES) {                                                 \
            for (int l = 0; l < LANES; l++) {                                                          \
                T v = x[st + l];                                                                       \
                lo[l] = v < lo[l] ? v : lo[l];                                                         \
                hi[l] = v > hi[l] ? v : hi[l];                                                         \
            }                                                                                          \
        }                                                                                              \
        for (int64_t i = full; i < size; i++) {                                                        \
            T v = x[i];                                                                                \
            lo[0] = v < lo[0] ? v : lo[0];                                                             \
            hi[0] = v > hi[0] ? v : hi[0];                                                             \
        }                                                                                              \
        T mn = lo[0], mx = hi[0];                                                                      \
        for (int l = 1; l < LANES; l++) mn = lo[l] < mn ? lo[l] : mn, mx = hi[l] > mx ? hi[l] : mx;    \
        out[0] = (double)mn, out[1] = (double)mx;                                                      \
    }

PAIR(pair_f32, float)
PAIR(pair_f64, double)
RANGE(range_f32, float)
RANGE(range_f64, double)

/* One activation: `ref` and `pre` of type `ftype` (F32/F64), `post` of `ftype` or an integer type (dequantized with
 * scale and zero_point). local: both comparisons; else the cumulative one only (ref vs post, LOC slots untouched).
 * Returns 0, or -1 for a combination of types it does not handle (the caller checks types first). */
int qd_activation(const void *ref, const void *pre, const void *post, int64_t size, int ftype, int ptype,
                  double scale, int32_t zero_point, double mlo, double mhi, double plo, double phi, int local,
                  double *out) {
    int f64 = ftype == F64;
    if (ftype != F32 && ftype != F64) return -1;
    if (local) {
        Both acc;
        memset(&acc, 0, sizeof(acc));
        float s32 = (float)scale;
        switch (ptype) {
        case F32: if (f64) return -1; both_f32(ref, pre, post, size, mlo, mhi, plo, phi, &acc); break;
        case F64: if (!f64) return -1; both_f64(ref, pre, post, size, mlo, mhi, plo, phi, &acc); break;
        case U8: dequant_u8(ref, pre, post, size, f64, s32, zero_point, mlo, mhi, plo, phi, &acc); break;
        case I8: dequant_i8(ref, pre, post, size, f64, s32, zero_point, mlo, mhi, plo, phi, &acc); break;
        case U16: dequant_u16(ref, pre, post, size, f64, s32, zero_point, mlo, mhi, plo, phi, &acc); break;
        case I16: dequant_i16(ref, pre, post, size, f64, s32, zero_point, mlo, mhi, plo, phi, &acc); break;
        default: return -1;
        }
        both_out(&acc, out);
    } else {
        if (ptype != ftype) return -1;
        if (f64) pair_f64(ref, post, size, -INFINITY, INFINITY, mlo, mhi, out + CUM_SIGNAL);
        else pair_f32(ref, post, size, -INFINITY, INFINITY, mlo, mhi, out + CUM_SIGNAL);
    }
    if (f64) range_f64(ref, size, out + REF_MIN);
    else range_f32(ref, size, out + REF_MIN);
    return 0;
}

/* qd_activation for n activations at once: ptrs is (n, 3) addresses (ref, pre, post), sizes (n,), types (n, 3)
 * (ftype, ptype, local), params (n, 5) (scale, mlo, mhi, plo, phi), zero_points (n,), out (n, SLOTS). One call per
 * sample instead of one per activation: on a model of hundreds of small tensors the per-call cost is what a sample's
 * reduction is made of. Returns the index of the first activation it could not handle, or -1. */
int64_t qd_activations(int64_t n, const int64_t *ptrs, const int64_t *sizes, const int32_t *types,
                       const double *params, const int32_t *zero_points, double *out) {
    for (int64_t j = 0; j < n; j++) {
        const int64_t *p = ptrs + 3 * j;
        const int32_t *t = types + 3 * j;
        const double *q = params + 5 * j;
        int rc = qd_activation((const void *)p[0], (const void *)p[1], (const void *)p[2], sizes[j], t[0], t[1],
                               q[0], zero_points[j], q[1], q[2], q[3], q[4], t[2], out + SLOTS * j);
        if (rc != 0) return j;
    }
    return -1;
}

/* qd_activation for every sample of a batch: ref, pre, post are C-contiguous (outer, n, inner) arrays whose [:, i, :]
 * is sample i, ref and pre of `ftype`, post of `ptype` (`ftype`, or integers dequantized with scale and zero_point);
 * out is (n, SLOTS), sums over the outer blocks. */
int qd_batch(const void *ref, const void *pre, const void *post, int64_t outer, int64_t n, int64_t inner, int ftype,
             int ptype, double scale, int32_t zero_point, double mlo, double mhi, double plo, double phi, int local,
             double *out) {
    static const size_t widths[] = {sizeof(float), sizeof(double), 1, 1, 2, 2};
    if (ftype < F32 || ftype > F64 || ptype < F32 || ptype > I16) return -1;
    size_t fw = widths[ftype], pw = widths[ptype];
    double row[SLOTS];
    for (int64_t i = 0; i < n; i++) {
        double *acc = out + SLOTS * i;
        memset(acc, 0, sizeof(double) * SLOTS);
        acc[REF_MIN] = INFINITY, acc[REF_MAX] = -INFINITY;
        for (int64_t o = 0; o < outer; o++) {
            size_t at = (size_t)((o * n + i) * inner);
            memset(row, 0, sizeof(row));
            int rc = qd_activation((const char *)ref + at * fw, (const char *)pre + at * fw,
                                   (const char *)post + at * pw, inner, ftype, ptype, scale, zero_point, mlo, mhi,
                                   plo, phi, local, row);
            if (rc != 0) return rc;
            for (int k = CUM_SIGNAL; k <= LOC_SIGNAL; k += LOC_SIGNAL - CUM_SIGNAL) {
                acc[k] += row[k];
                acc[k + 1] += row[k + 1];
                acc[k + 2] = row[k + 2] > acc[k + 2] ? row[k + 2] : acc[k + 2];
            }
            acc[REF_MIN] = row[REF_MIN] < acc[REF_MIN] ? row[REF_MIN] : acc[REF_MIN];
            acc[REF_MAX] = row[REF_MAX] > acc[REF_MAX] ? row[REF_MAX] : acc[REF_MAX];
        }
    }
    return 0;
}

/* pair_sums and value_range on their own (tests and benchmarks compare them with the fused pass). */
int qd_pair(const void *x, const void *y, int64_t size, int ftype, double xlo, double xhi, double lo, double hi,
            double *out) {
    if (ftype == F32) pair_f32(x, y, size, xlo, xhi, lo, hi, out);
    else if (ftype == F64) pair_f64(x, y, size, xlo, xhi, lo, hi, out);
    else return -1;
    return 0;
}

int qd_range(const void *x, int64_t size, int ftype, double *out) {
    if (ftype == F32) range_f32(x, size, out);
    else if (ftype == F64) range_f64(x, size, out);
    else return -1;
    return 0;
}
