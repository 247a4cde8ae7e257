/* The chunked form of the gated delta rule (kiri_delta_chunk_fn), written once over a handful of
 * vector macros, and included by the SIMD files that define them (ops_avx2.c, ops_avx512.c,
 * ops_neon.c) right where the function is to be:
 *   DC_NAME   the function's name          DC_ATTR   its attributes (static, target)
 *   DC_VEC    the vector type              DC_LANES  its floats
 *   DC_LOAD(p), DC_STORE(p, v), DC_SET1(s), DC_ZERO(), DC_MUL(a, b), DC_ADD(a, b),
 *   DC_FMA(a, b, c) (a b + c), DC_FNMA(a, b, c) (c - a b)
 *   DC_GROUP  tokens whose products with the state run side by side (registers: 2 DC_GROUP + 3)
 *   DC_HEAD   the tier's kiri_delta_head_fn, for what the chunked form does not take.
 *
 * Why: token by token, a head's state (S x S, 64 KiB on Qwen3.5) is read and written once per
 * token, and a step's heads together outgrow the L2 cache, so prefill waits on memory. Over a
 * chunk of c tokens the state is read and written once, and the work is small matrix products.
 *
 * The algebra. With G_t the product of the chunk's decays up to token t (R(t, s) = G_t / G_s,
 * formed as the product of the decays s+1..t, never as a quotient), the state after token t is
 *   M_t = G_t M_0 + sum_{s <= t} R(t, s) u_s k_s^T,
 * where u_t is the update the token-by-token rule would add (its beta (v - M k)):
 *   u_t = beta_t (v_t - G_t M_0 k_t) - sum_{s < t} beta_t R(t, s) (k_s . k_t) u_s,
 * a triangular system solved forward, and the output is
 *   y_t = scale (G_t M_0 q_t + sum_{s <= t} R(t, s) (k_s . q_t) u_s).
 * Row j of the state only meets v_t[j], so DC_LANES rows at a time (transposed into one vector
 * per key dimension) go through: the products with the chunk's keys and queries, the forward
 * solve, the outputs, then the state's update by the chunk's rank-c product. Equal to the token
 * by token rule in exact arithmetic; in float within a few roundings of it (tests/ops_check.c). */

/* The largest head the chunked form takes (Qwen3.5's are 128); larger heads go token by token.
 * Its scratch, on the stack, is some 120 KiB at this size. */
#define DC_MAX_HEAD 128

DC_ATTR void DC_NAME(float *state, const float *q, const float *k, const float *v, size_t x_stride,
                     const float *beta, const float *log_decay, size_t g_stride, float scale, int64_t n,
                     int64_t n_tok, float *y, size_t y_stride)
{
    enum { C = KIRI_DELTA_CHUNK };
    if (n % DC_LANES || n > DC_MAX_HEAD || n_tok < 1 || n_tok > C) {
        for (int64_t t = 0; t < n_tok; t++)
            DC_HEAD(state, q + (size_t)t * x_stride, k + (size_t)t * x_stride, v + (size_t)t * x_stride,
                    beta[(size_t)t * g_stride], expf(log_decay[(size_t)t * g_stride]), scale, n,
                    y + (size_t)t * y_stride);
        return;
    }
    const int64_t c = n_tok, cp = (c + DC_LANES - 1) / DC_LANES * DC_LANES; /* tokens, padded */
    /* The chunk's keys and queries transposed (kt[i * cp + t] = k_t[i], zero past c), so that a
     * key dimension of consecutive tokens is one vector, or consecutive scalars to broadcast. */
    float kt[DC_MAX_HEAD * C] __attribute__((aligned(64))), qt[DC_MAX_HEAD * C] __attribute__((aligned(64)));
    for (int64_t t = 0; t < cp; t++) {
        const float *ks = k + (size_t)t * x_stride, *qs = q + (size_t)t * x_stride;
        if (t < c)
            for (int64_t i = 0; i < n; i++) {
                kt[i * cp + t] = ks[i];
                qt[i * cp + t] = qs[i];
            }
        else
            for (int64_t i = 0; i < n; i++)
                kt[i * cp + t] = qt[i * cp + t] = 0.0f;
    }
    /* The chunk's scalars: decays, G_t, R(c - 1, s), and the two triangles of the algebra above,
     * transposed (at[s * cp + t]: beta_t R(t, s) k_s . k_t below the diagonal; bt[s * cp + t]:
     * R(t, s) k_s . q_t, the diagonal too), their dot products a row of tokens at a time. */
    float g[C], G[C], last[C];
    float at[C * C] __attribute__((aligned(64))), bt[C * C] __attribute__((aligned(64)));
    for (int64_t t = 0; t < c; t++) {
        g[t] = expf(log_decay[(size_t)t * g_stride]);
        G[t] = t ? G[t - 1] * g[t] : g[t];
    }
    for (int64_t s0 = 0; s0 < c; s0 += 4) { /* four keys at a time: independent sums */
        for (int64_t t0 = 0; t0 < cp; t0 += DC_LANES) {
            DC_VEC kk[4], qk[4];
            DC_UNROLL for (int si = 0; si < 4; si++) kk[si] = qk[si] = DC_ZERO();
            for (int64_t i = 0; i < n; i++) {
                const DC_VEC kv = DC_LOAD(kt + i * cp + t0), qv = DC_LOAD(qt + i * cp + t0);
                const float *ks = kt + i * cp + s0; /* past c: zeros, or the next tokens' */
                DC_UNROLL for (int si = 0; si < 4; si++) {
                    kk[si] = DC_FMA(DC_SET1(ks[si]), kv, kk[si]);
                    qk[si] = DC_FMA(DC_SET1(ks[si]), qv, qk[si]);
                }
            }
            for (int64_t si = 0; si < 4 && s0 + si < c; si++) {
                DC_STORE(at + (s0 + si) * cp + t0, kk[si]);
                DC_STORE(bt + (s0 + si) * cp + t0, qk[si]);
            }
        }
    }
    for (int64_t t = 0; t < c; t++) {
        const float b = beta[(size_t)t * g_stride];
        float r = 1.0f; /* R(t, s) */
        for (int64_t s = t; s >= 0; s--) {
            at[s * cp + t] *= b * r;
            bt[s * cp + t] *= r;
            r *= g[s];
        }
    }
    for (int64_t s = 0; s < c; s++) {
        float r = 1.0f;
        for (int64_t t = c - 1; t > s; t--)
            r *= g[t];
        last[s] = r;
    }

    /* Mt[i * DC_LANES + l] holds M[jb + l][i]: the block's rows, transposed. */
    float mt[DC_MAX_HEAD * DC_LANES] __attribute__((aligned(64)));
    DC_VEC Ka[C], Qb[C], U[C];
    for (int64_t jb = 0; jb < n; jb += DC_LANES) {
        for (int l = 0; l < DC_LANES; l++) {
            const float *row = state + (size_t)(jb + l) * (size_t)n;
            for (int64_t i = 0; i < n; i++)
                mt[i * DC_LANES + l] = row[i];
        }
        /* M_0 k_t and M_0 q_t for every token, DC_GROUP tokens per pass over the block. */
        for (int64_t t0 = 0; t0 < c; t0 += DC_GROUP) {
            DC_VEC ak[DC_GROUP], aq[DC_GROUP];
            DC_UNROLL for (int gi = 0; gi < DC_GROUP; gi++) ak[gi] = aq[gi] = DC_ZERO();
            if (t0 + DC_GROUP <= cp) {
                for (int64_t i = 0; i < n; i++) {
                    const DC_VEC m = DC_LOAD(mt + i * DC_LANES);
                    const float *ki = kt + i * cp + t0, *qi = qt + i * cp + t0;
                    DC_UNROLL for (int gi = 0; gi < DC_GROUP; gi++) {
                        ak[gi] = DC_FMA(m, DC_SET1(ki[gi]), ak[gi]);
                        aq[gi] = DC_FMA(m, DC_SET1(qi[gi]), aq[gi]);
                    }
                }
            } else {
                for (int64_t i = 0; i < n; i++) {
                    const DC_VEC m = DC_LOAD(mt + i * DC_LANES);
                    for (int64_t gi = 0; gi < cp - t0; gi++) {
                        ak[gi] = DC_FMA(m, DC_SET1(kt[i * cp + t0 + gi]), ak[gi]);
                        aq[gi] = DC_FMA(m, DC_SET1(qt[i * cp + t0 + gi]), aq[gi]);
                    }
                }
            }
            for (int gi = 0; gi < DC_GROUP && t0 + gi < c; gi++) {
                Ka[t0 + gi] = ak[gi];
                Qb[t0 + gi] = aq[gi];
            }
        }
        /* The updates, forward, and the outputs. */
        for (int64_t t = 0; t < c; t++) {
            const DC_VEC vt = DC_LOAD(v + (size_t)t * x_stride + jb);
            /* two sums each, so that their chains of multiply-adds overlap */
            DC_VEC u0 = DC_MUL(DC_SET1(beta[(size_t)t * g_stride]), DC_FNMA(DC_SET1(G[t]), Ka[t], vt));
            DC_VEC u1 = DC_ZERO();
            int64_t s = 0;
            for (; s + 2 <= t; s += 2) {
                u0 = DC_FNMA(DC_SET1(at[s * cp + t]), U[s], u0);
                u1 = DC_FNMA(DC_SET1(at[(s + 1) * cp + t]), U[s + 1], u1);
            }
            if (s < t)
                u0 = DC_FNMA(DC_SET1(at[s * cp + t]), U[s], u0);
            U[t] = DC_ADD(u0, u1);
            DC_VEC o0 = DC_MUL(DC_SET1(G[t]), Qb[t]), o1 = DC_ZERO();
            for (s = 0; s + 2 <= t + 1; s += 2) {
                o0 = DC_FMA(DC_SET1(bt[s * cp + t]), U[s], o0);
                o1 = DC_FMA(DC_SET1(bt[(s + 1) * cp + t]), U[s + 1], o1);
            }
            if (s <= t)
                o0 = DC_FMA(DC_SET1(bt[s * cp + t]), U[s], o0);
            DC_STORE(y + (size_t)t * y_stride + jb, DC_MUL(DC_SET1(scale), DC_ADD(o0, o1)));
        }
        /* M_c = G_c M_0 + sum_s R(c, s) u_s k_s^T, DC_GROUP key dimensions at a time (head sizes
         * are multiples of DC_LANES, so of DC_GROUP). */
        for (int64_t t = 0; t < c; t++)
            U[t] = DC_MUL(DC_SET1(last[t]), U[t]);
        const DC_VEC gc = DC_SET1(G[c - 1]);
        for (int64_t i0 = 0; i0 < n; i0 += DC_GROUP) {
            DC_VEC acc[DC_GROUP];
            DC_UNROLL for (int gi = 0; gi < DC_GROUP; gi++) acc[gi] = DC_MUL(gc, DC_LOAD(mt + (i0 + gi) * DC_LANES));
            for (int64_t t = 0; t < c; t++) {
                const float *kti = k + (size_t)t * x_stride + i0;
                const DC_VEC ut = U[t];
                DC_UNROLL for (int gi = 0; gi < DC_GROUP; gi++) acc[gi] = DC_FMA(DC_SET1(kti[gi]), ut, acc[gi]);
            }
            DC_UNROLL for (int gi = 0; gi < DC_GROUP; gi++) DC_STORE(mt + (i0 + gi) * DC_LANES, acc[gi]);
        }
        for (int l = 0; l < DC_LANES; l++) {
            float *row = state + (size_t)(jb + l) * (size_t)n;
            for (int64_t i = 0; i < n; i++)
                row[i] = mt[i * DC_LANES + l];
        }
    }
}

#undef DC_MAX_HEAD
