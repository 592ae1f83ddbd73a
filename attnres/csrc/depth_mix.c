/* CPU kernels for the depth mixing of AttnRes (attnres/cpu_kernels.py builds and loads this file).
 *
 * Plain C, fp32, contiguous rows of D floats, one token per OpenMP iteration: every row a kernel touches for a
 * token (S sources, Q reads, their gradients and sinks: a few KiB) is loaded once and stays in L1 for all the
 * token's multiply-adds and dot products. depth.py's torch references are what these kernels compute (the tests
 * check them against each other); design and measurements: docs/depth_ops.md. Sinks: attnres/grad_sinks.py.
 *
 * Weights are indexed [S, N, Q] (the caller's [S, B, T, Q] with N = B * T tokens), rows of source/read/grad
 * tensors are [N, D]. No allocation here: the caller owns every buffer.
 */
#include <math.h>
#include <stddef.h>

#define LANES 16

/* a . b over D floats with LANES independent partial sums, so the compiler vectorises without -ffast-math */
static inline float dot(const float *a, const float *b, int D) {
    float acc[LANES] = {0};
    int d = 0;
    for (; d + LANES <= D; d += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += a[d + k] * b[d + k];
    float s = 0.f;
    for (; d < D; d++) s += a[d] * b[d];
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

/* Q reads of the same S sources (paper Algorithm 1, phase 1):
 *   out_q[t] = sum_s w[s, t, q] * v_s[t]                                  for q < Q */
void attnres_mix_forward(int S, int Q, long N, int D, const float *const *v, const float *w, float *const *out,
                         int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long t = 0; t < N; t++) {
        const float *x = v[0] + t * D;
        for (int q = 0; q < Q; q++) {
            float *o = out[q] + t * D;
            const float c = w[t * Q + q];
            for (int d = 0; d < D; d++) o[d] = c * x[d];
        }
        for (int s = 1; s < S; s++) {
            x = v[s] + t * D;
            const float *ws = w + ((long)s * N + t) * Q;
            for (int q = 0; q < Q; q++) {
                float *o = out[q] + t * D;
                const float c = ws[q];
                for (int d = 0; d < D; d++) o[d] += c * x[d];
            }
        }
    }
}

/* Its backward, given the reads' gradients g_q (NULL: read unused):
 *   dots[s, t, q] = g_q[t] . v_s[t]                       (if dots is not NULL; 0 for an unused read)
 *   sink_s[t] = / += sum_q w[s, t, q] * g_q[t]           (mode[s]: 0 skip, 1 write, 2 accumulate) */
void attnres_mix_backward(int S, int Q, long N, int D, const float *const *v, const float *w,
                          const float *const *g, float *dots, float *const *sink, const int *mode, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long t = 0; t < N; t++) {
        for (int s = 0; s < S; s++) {
            const float *x = v[s] + t * D;
            const float *ws = w + ((long)s * N + t) * Q;
            if (dots)
                for (int q = 0; q < Q; q++)
                    dots[((long)s * N + t) * Q + q] = g[q] ? dot(g[q] + t * D, x, D) : 0.f;
            if (!mode[s]) continue;
            float *o = sink[s] + t * D;
            int written = mode[s] == 2;
            for (int q = 0; q < Q; q++) {
                if (!g[q]) continue;
                const float *gq = g[q] + t * D;
                const float c = ws[q];
                if (written) for (int d = 0; d < D; d++) o[d] += c * gq[d];
                else for (int d = 0; d < D; d++) o[d] = c * gq[d];
                written = 1;
            }
            if (!written) for (int d = 0; d < D; d++) o[d] = 0.f;
        }
    }
}

#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID omp_get_thread_num()
#else
#define THREAD_ID 0
#endif

#define MAX_EXTRAS 64

/* One read's phase 2 (paper Algorithm 1) fused with the PreNorm normalisation, in place (depth.merge_read):
 *   with queries: logit_k = key_rstd_k (e_k . q_k), key_rstd_k = (mean e_k^2 + key_eps)^-1/2, z_k += logit_k
 *   a = softmax([0, z_1 .. z_K]),  h = a_0 base + sum_k a_k e_k,  rstd = (mean h^2 + eps)^-1/2,  base <- h rstd
 * Saves a [K + 1, N], rstd [N] and, with queries, logits and key_rstd [K, N]. */
void attnres_merge_forward(int K, long N, int D, float *base, const float *z, const float *const *e,
                           const float *queries, float key_eps, float eps, float *a, float *rstd, float *logits,
                           float *key_rstd, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long t = 0; t < N; t++) {
        float *h = base + t * D;
        float zk[MAX_EXTRAS + 1];
        zk[0] = 0.f;
        float top = 0.f;
        for (int k = 0; k < K; k++) {
            const float *x = e[k] + t * D;
            float l = z[(long)k * N + t];
            if (queries) {
                float r = 1.f / sqrtf(dot(x, x, D) / D + key_eps);
                float lk = r * dot(x, queries + (long)k * D, D);
                key_rstd[(long)k * N + t] = r;
                logits[(long)k * N + t] = lk;
                l += lk;
            }
            zk[k + 1] = l;
            if (l > top) top = l;
        }
        float total = 0.f;
        for (int k = 0; k <= K; k++) total += (zk[k] = expf(zk[k] - top));
        for (int k = 0; k <= K; k++) a[(long)k * N + t] = zk[k] / total;
        if (K > 0) {
            const float a0 = a[t];
            for (int d = 0; d < D; d++) h[d] *= a0;
            for (int k = 0; k < K; k++) {
                const float *x = e[k] + t * D;
                const float c = a[(long)(k + 1) * N + t];
                for (int d = 0; d < D; d++) h[d] += c * x[d];
            }
        }
        const float r = 1.f / sqrtf(dot(h, h, D) / D + eps);
        rstd[t] = r;
        for (int d = 0; d < D; d++) h[d] *= r;
    }
}

/* Its backward, from g = dL/dy and y = the normalised read (docstring of depth._MergeReadC for the algebra):
 *   m = mean(g y), u = g - m y (dL/dh = rstd u), g.h = m D eps rstd (in units of u)
 *   grad_z_k = rstd a_k (u . e_k - g.h),  grad_base = rstd a_0 u
 *   extra k (into targets[k], mode 1: =, 2: +=): rstd a_k u, and with queries the key logit's terms
 *   scaled_k q_k - coef_k e_k, scaled_k = grad_z_k key_rstd_k, coef_k = grad_z_k logit_k key_rstd_k^2 / D;
 *   grad_q [threads, K, D] (zeroed by the caller) += scaled_k e_k, one slice per thread, summed by the caller. */
void attnres_merge_backward(int K, long N, int D, const float *g, const float *y, const float *a,
                            const float *rstd, float eps, const float *const *e, const float *queries,
                            const float *logits, const float *key_rstd, float *grad_base, float *grad_z,
                            float *grad_q, float *const *targets, const int *modes, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long t = 0; t < N; t++) {
        const float *gt = g + t * D, *yt = y + t * D;
        float *gb = grad_base + t * D;
        const float r = rstd[t];
        const float m = dot(gt, yt, D) / D;
        const float a0 = K > 0 ? a[t] : 1.f;
        for (int d = 0; d < D; d++) gb[d] = gt[d] - m * yt[d];  /* u, scaled below */
        const float gh = m * D * eps * r;
        for (int k = 0; k < K; k++) {
            const float *x = e[k] + t * D;
            const float ak = a[(long)(k + 1) * N + t];
            const float gz = r * ak * (dot(gb, x, D) - gh);
            grad_z[(long)k * N + t] = gz;
            float scaled = 0.f, coef = 0.f;
            if (queries) {
                const float kr = key_rstd[(long)k * N + t];
                scaled = gz * kr;
                coef = gz * logits[(long)k * N + t] * kr * kr / D;
                float *gq = grad_q + ((long)THREAD_ID * K + k) * D;
                for (int d = 0; d < D; d++) gq[d] += scaled * x[d];
            }
            if (!modes[k]) continue;
            float *o = targets[k] + t * D;
            const float c = r * ak;
            const float *q = queries ? queries + (long)k * D : NULL;
            if (modes[k] == 1) for (int d = 0; d < D; d++) o[d] = c * gb[d];
            else for (int d = 0; d < D; d++) o[d] += c * gb[d];
            if (q) for (int d = 0; d < D; d++) o[d] += scaled * q[d] - coef * x[d];
        }
        const float c0 = r * a0;
        for (int d = 0; d < D; d++) gb[d] *= c0;
    }
}
