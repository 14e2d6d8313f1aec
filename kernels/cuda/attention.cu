/* Causal self-attention with grouped-query heads, the two paths of kernels/cpu/attention.c:
 *
 * - unfused (probs != NULL): scores and the products with V on cuBLAS (strided-batched over
 *   the KV groups, one call per batch element and head of a group), and one kernel for
 *   scale-mask-softmax and dropout in between. The scores pass through the act dtype on their
 *   way into the softmax, as in Megatron's unfused path; the softmax itself is fp32.
 * - fused (probs == NULL): a flash-style kernel (online softmax over tiles of 32 keys, Milakov &
 *   Gimelshein 2018; Dao et al. 2022) that keeps only each row's log-sum-exp, and a backward
 *   of two kernels that recompute the probabilities from it: one per query row for dq (and
 *   rowsum(dO * O)), one per key row for dk and dv, each summing over the heads of its KV
 *   group, so there are no atomics and nothing of size Tq x Tk is stored. Correct first; it is
 *   not a FlashAttention-2 (no tensor cores).
 *
 * Heads of KV group g are g*rep .. g*rep + rep - 1 (rep = H/KV). For fixed batch element b and
 * index r within the group, the heads g*rep + r of all groups sit at a constant stride in q
 * (rep*D), in k and v (D), in the probabilities (rep*Tq*Tk) and in out (rep*D): that is the
 * batch of one strided-batched GEMM. */
#include "kernels/cuda/common.cuh"

/* ---- shared by both paths ---- */

/* The value (and output) heads' width: D unless the caller gives its own (kernels.h). */
__host__ __device__ __forceinline__ int attn_dv(int D, int Dv) { return Dv > 0 ? Dv : D; }

static void attn_check(int B, int Tq, int Tk, int H, int KV, int D, int Dv, int q_offset,
                       int q_stride, int k_stride, int v_stride)
{
    KERN_CHECK(B >= 0 && Tq >= 0 && H > 0 && KV > 0 && D > 0 && Dv > 0, "attention: bad sizes");
    KERN_CHECK(Tk > 0 || Tq == 0 || B == 0, "attention: no keys");
    KERN_CHECK(H % KV == 0, "attention: heads must be a multiple of KV groups");
    KERN_CHECK(q_offset >= 0, "attention: negative q_offset");
    KERN_CHECK(q_stride >= H * D && k_stride >= KV * D && v_stride >= KV * Dv,
               "attention: a stride is shorter than its row of heads");
}

/* MXFP8 attention's second copy of an operand (kernels.h: KernAttnFwd.v_col, KernAttnBwd's
 * q_col, k_col, dout_col), or the operand itself where the caller gives none. */
__host__ __device__ __forceinline__ const void *attn_second(const void *first, const void *second)
{
    return second ? second : first;
}

/* Number of keys query t sees: 0 .. q_offset + t, clamped to the keys there are. */
__device__ __forceinline__ int attn_visible(int q_offset, int t, int Tk)
{
    long long last = (long long)q_offset + t;
    return last + 1 < (long long)Tk ? (int)(last + 1) : Tk;
}

/* Zeroes the KV-group slices [rows, width] of a strided dk or dv, and nothing between them
 * (they may be views into a packed dqkv). */
template <typename T>
__global__ void zero_rows_kernel(T *x, size_t rows, int width, int stride)
{
    GRID_STRIDE(i, rows * width)
        x[(i / width) * stride + i % width] = from_f<T>(0.0f);
}

template <typename T> static void zero_rows(void *x, size_t rows, int width, int stride)
{
    const size_t n = rows * width;
    if (n)
        KLAUNCH(zero_rows_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)x, rows,
                width, stride);
}

/* ---- unfused path ---- */

enum { SM_WARPS = 8 };

/* One warp per row of scores (B*H*Tq rows of Tk): softmax over the visible keys in fp32, 0 for
 * the others; with dropout, the keep mask (each entry drawing its place in the stream, head
 * dhead and query row drow apart, as the CPU does) and the dropped, rescaled copy. */
template <typename T>
__global__ void softmax_fwd_kernel(T *probs, uint8_t *mask, T *pdrop, size_t rows, int Tq,
                                   int Tk, int q_offset, float p, float keep_scale, uint64_t seed,
                                   uint64_t drow, uint64_t dhead, const T *sinks, int H)
{
    // sinks (may be NULL) is (H): head (row / Tq) % H's joins the denominator
    // probs, mask, pdrop are (rows, Tk); probs holds the scaled scores on entry
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (size_t row = blockIdx.x * (size_t)SM_WARPS + warp; row < rows;
         row += (size_t)gridDim.x * SM_WARPS) {
        T *s = probs + row * Tk;
        const int vis = attn_visible(q_offset, (int)(row % Tq), Tk);
        float mx = -INFINITY;
        for (int j = lane; j < vis; j += 32)
            mx = fmaxf(mx, to_f(s[j]));
        mx = warp_max(mx);
        const float sink = sinks ? to_f(sinks[(row / Tq) % H]) : -INFINITY;
        mx = fmaxf(mx, sink);
        float sum = 0.0f;
        for (int j = lane; j < vis; j += 32)
            sum += expf(to_f(s[j]) - mx);
        const float inv = 1.0f / (warp_sum(sum) + (sinks ? expf(sink - mx) : 0.0f));
        for (int j = lane; j < Tk; j += 32) {
            const float pr = j < vis ? expf(to_f(s[j]) - mx) * inv : 0.0f;
            s[j] = from_f<T>(pr);
            if (mask) {
                const size_t idx = row * Tk + j;
                const int keep = kern_dropout_keep(
                    seed, (row / Tq) * dhead + (row % Tq) * drow + (uint64_t)j, p);
                mask[idx] = (uint8_t)keep;
                pdrop[idx] = from_f<T>(keep ? pr * keep_scale : 0.0f);
            }
        }
    }
}

/* One warp per row: dP = dPu (* mask / (1-p)), then dS = P (dP - rowsum(dP P)), in place over
 * the row of dscores. */
template <typename T>
__global__ void softmax_bwd_kernel(T *dscores, const T *probs, const uint8_t *mask, size_t rows,
                                   int Tk, float keep_scale)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (size_t row = blockIdx.x * (size_t)SM_WARPS + warp; row < rows;
         row += (size_t)gridDim.x * SM_WARPS) {
        T *ds = dscores + row * Tk;
        const T *pr = probs + row * Tk;
        const uint8_t *mk = mask ? mask + row * Tk : NULL;
        float dot = 0.0f;
        for (int j = lane; j < Tk; j += 32) {
            float d = to_f(ds[j]);
            if (mk)
                d = mk[j] ? d * keep_scale : 0.0f;
            dot += d * to_f(pr[j]);
        }
        dot = warp_sum(dot);
        for (int j = lane; j < Tk; j += 32) {
            float d = to_f(ds[j]);
            if (mk)
                d = mk[j] ? d * keep_scale : 0.0f;
            ds[j] = from_f<T>(to_f(pr[j]) * (d - dot));
        }
    }
}

static unsigned rows_grid(size_t rows)
{
    size_t want = (rows + SM_WARPS - 1) / SM_WARPS, cap = (size_t)kern_cuda_ctx()->sms * 64;
    return want > cap ? (unsigned)cap : want ? (unsigned)want : 1u;
}

template <typename T> static void attn_fwd_unfused(const KernAttnFwd *a)
{
    // q is (B,Tq,q_stride), k (B,Tk,k_stride), v (B,Tk,v_stride); out is (B,Tq,H*Dv);
    // probs, mask, probs_drop are (B,H,Tq,Tk)
    const int B = a->B, Tq = a->Tq, Tk = a->Tk, H = a->H, KV = a->KV, D = a->D, rep = H / KV;
    const int Dv = attn_dv(D, a->Dv);
    const cudaDataType dt = ActTraits<T>::blas;
    const T *q = (const T *)a->q, *k = (const T *)a->k;
    const T *v = (const T *)attn_second(a->v, a->v_col); /* O = P V's (MXFP8: column-wise) */
    T *out = (T *)a->out, *probs = (T *)a->probs, *pdrop = (T *)a->probs_drop;
    const size_t tile = (size_t)Tq * Tk, ldo = (size_t)H * Dv;
    const int drop = a->dropout > 0.0f;
    KERN_CHECK(!drop || (a->mask && pdrop), "attention: dropout needs mask and probs_drop");
    KERN_CHECK(a->dropout < 1.0f, "attention: dropout must be below 1");
    for (int b = 0; b < B; b++)
        for (int r = 0; r < rep; r++)
            // S[Tq,Tk] = scale Q_h K_g^T, into probs; the softmax overwrites masked scores
            kern_cuda_gemm(probs + ((size_t)b * H + r) * tile, dt, Tk, (long long)rep * tile,
                           q + (size_t)b * Tq * a->q_stride + (size_t)r * D, a->q_stride,
                           (long long)rep * D, k + (size_t)b * Tk * a->k_stride, a->k_stride, D,
                           dt, Tq, Tk, D, 0, 1, a->scale, 0.0f, KV);
    const size_t rows = (size_t)B * H * Tq;
    KLAUNCH(softmax_fwd_kernel<T>, rows_grid(rows), SM_WARPS * 32, 0, probs,
            drop ? a->mask : (uint8_t *)NULL, drop ? pdrop : (T *)NULL, rows, Tq, Tk,
            a->q_offset, a->dropout, drop ? 1.0f / (1.0f - a->dropout) : 1.0f, a->seed,
            a->drop_row ? a->drop_row : (uint64_t)Tk, a->drop_head ? a->drop_head : (uint64_t)tile,
            (const T *)a->sinks, H);
    const T *used = drop ? pdrop : probs;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < rep; r++)
            // O_h[Tq,Dv] = P_h V_g
            kern_cuda_gemm(out + (size_t)b * Tq * ldo + (size_t)r * Dv, dt, (int)ldo,
                           (long long)rep * Dv, used + ((size_t)b * H + r) * tile, Tk,
                           (long long)rep * tile, v + (size_t)b * Tk * a->v_stride, a->v_stride,
                           Dv, dt, Tq, Dv, Tk, 0, 0, 1.0f, 0.0f, KV);
}

/* With P the softmax, Pu the probabilities that multiplied V and dO the output gradient:
 * dV = Pu^T dO, dPu = dO V^T, dS = softmax backward of dPu, dQ = scale dS K, dK = scale dS^T Q.
 * dV and dK sum over the heads of a group: beta = 1 after the zeroing. */
template <typename T> static void attn_bwd_unfused(const KernAttnBwd *a)
{
    const int B = a->B, Tq = a->Tq, Tk = a->Tk, H = a->H, KV = a->KV, D = a->D, rep = H / KV;
    const int Dv = attn_dv(D, a->Dv);
    const cudaDataType dt = ActTraits<T>::blas;
    /* dK, dQ and dV reduce over a sequence: Q, K and dO's column-wise copies (MXFP8); dP over
     * head_dim: the row-wise dO and V */
    const T *q = (const T *)attn_second(a->q, a->q_col), *k = (const T *)attn_second(a->k, a->k_col);
    const T *v = (const T *)a->v, *dout_c = (const T *)attn_second(a->dout, a->dout_col);
    const T *dout = (const T *)a->dout, *probs = (const T *)a->probs;
    T *dq = (T *)a->dq, *dk = (T *)a->dk, *dv = (T *)a->dv, *dS = (T *)a->dscores;
    const size_t tile = (size_t)Tq * Tk, ldo = (size_t)H * Dv;
    const int drop = a->dropout > 0.0f;
    KERN_CHECK(dS != NULL, "attention: the unfused backward needs dscores");
    KERN_CHECK(!drop || (a->mask && a->probs_drop), "attention: dropout needs mask and probs_drop");
    KERN_CHECK(a->dropout < 1.0f, "attention: dropout must be below 1");
    const T *used = drop ? (const T *)a->probs_drop : probs;
    for (int b = 0; b < B; b++) {
        const T *dob = dout + (size_t)b * Tq * ldo, *docb = dout_c + (size_t)b * Tq * ldo;
        for (int r = 0; r < rep; r++) {
            const size_t bh = (size_t)b * H + r;
            // dV_g[Tk,Dv] += Pu_h^T dO_h
            kern_cuda_gemm(dv + (size_t)b * Tk * a->dv_stride, dt, a->dv_stride, Dv,
                           used + bh * tile, Tk, (long long)rep * tile, docb + (size_t)r * Dv,
                           (int)ldo, (long long)rep * Dv, dt, Tk, Dv, Tq, 1, 0, 1.0f, 1.0f, KV);
            // dPu[Tq,Tk] = dO_h V_g^T
            kern_cuda_gemm(dS + bh * tile, dt, Tk, (long long)rep * tile, dob + (size_t)r * Dv,
                           (int)ldo, (long long)rep * Dv, v + (size_t)b * Tk * a->v_stride,
                           a->v_stride, Dv, dt, Tq, Tk, Dv, 0, 1, 1.0f, 0.0f, KV);
        }
    }
    const size_t rows = (size_t)B * H * Tq;
    KLAUNCH(softmax_bwd_kernel<T>, rows_grid(rows), SM_WARPS * 32, 0, dS, probs,
            drop ? a->mask : (const uint8_t *)NULL, rows, Tk,
            drop ? 1.0f / (1.0f - a->dropout) : 1.0f);
    for (int b = 0; b < B; b++) {
        for (int r = 0; r < rep; r++) {
            const size_t bh = (size_t)b * H + r;
            // dQ_h[Tq,D] = scale dS K_g
            kern_cuda_gemm(dq + (size_t)b * Tq * a->dq_stride + (size_t)r * D, dt, a->dq_stride,
                           (long long)rep * D, dS + bh * tile, Tk, (long long)rep * tile,
                           k + (size_t)b * Tk * a->k_stride, a->k_stride, D, dt, Tq, D, Tk, 0, 0,
                           a->scale, 0.0f, KV);
            // dK_g[Tk,D] += scale dS^T Q_h
            kern_cuda_gemm(dk + (size_t)b * Tk * a->dk_stride, dt, a->dk_stride, D,
                           dS + bh * tile, Tk, (long long)rep * tile,
                           q + (size_t)b * Tq * a->q_stride + (size_t)r * D, a->q_stride,
                           (long long)rep * D, dt, Tk, D, Tq, 1, 0, a->scale, 1.0f, KV);
        }
    }
}

/* ---- fused path ---- */

/* Keys (or queries) per tile: one per lane, so a warp scores a whole tile at once. */
enum { FA_TILE = 32, FA_WARPS = 8 };

/* Row pitch of a tile in shared memory: odd, so that lane j reading element d of row j hits
 * bank (j*pitch + d) % 32, a different bank for every lane. */
__host__ __device__ __forceinline__ int fa_pitch(int D) { return D | 1; }

/* Loads rows j0 .. j0+FA_TILE-1 (zeros past `count`) of a strided [rows, D] view into a
 * shared [FA_TILE, pitch] fp32 tile; the whole block takes part. */
template <typename T>
__device__ __forceinline__ void fa_load_tile(float *dst, const T *src, int stride, int j0,
                                             int count, int D, int pitch)
{
    for (int idx = threadIdx.x; idx < FA_TILE * D; idx += blockDim.x) {
        const int jj = idx / D, d = idx % D, j = j0 + jj;
        dst[jj * pitch + d] = j < count ? to_f(src[(size_t)j * stride + d]) : 0.0f;
    }
}

/* Block: FA_WARPS query rows of one (b, h), a warp each; tiles of FA_TILE keys go through
 * shared memory (fp32), lane j scores key j0 + j. Online softmax: m the running maximum, l the
 * running sum of exp(s - m), acc the running sum of exp(s - m) v. */
template <typename T> __global__ void flash_fwd_kernel(KernAttnFwd a)
{
    const int Tq = a.Tq, Tk = a.Tk, H = a.H, D = a.D, rep = a.H / a.KV;
    const int Dv = attn_dv(D, a.Dv), Dm = D > Dv ? D : Dv, pitch = fa_pitch(Dm);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / rep;
    const int t0 = blockIdx.x * FA_WARPS, t = t0 + warp;
    const int last = (t0 + FA_WARPS < Tq ? t0 + FA_WARPS : Tq) - 1;
    const int active = t < Tq;
    float *Ks = dyn_smem<float>(), *Vs = Ks + FA_TILE * pitch;
    float *base = Vs + FA_TILE * pitch;
    float *qs = base + warp * Dm, *acc = base + FA_WARPS * Dm + warp * Dm;
    float *ps = base + 2 * FA_WARPS * Dm + warp * FA_TILE;
    const T *kb = (const T *)a.k + (size_t)b * Tk * a.k_stride + (size_t)g * D;
    /* O = P V reduces over the keys: V's column-wise copy (MXFP8) */
    const T *vb = (const T *)attn_second(a.v, a.v_col) + (size_t)b * Tk * a.v_stride + (size_t)g * Dv;
    if (active) {
        const T *qr = (const T *)a.q + ((size_t)b * Tq + t) * a.q_stride + (size_t)h * D;
        for (int d = lane; d < D; d += 32)
            qs[d] = to_f(qr[d]);
        for (int d = lane; d < Dv; d += 32)
            acc[d] = 0.0f;
    }
    const int vis = active ? attn_visible(a.q_offset, t, Tk) : 0;
    const int block_vis = attn_visible(a.q_offset, last, Tk); /* the most any row here sees */
    /* a sink starts the sum: exp(sink - m) with m = sink */
    float m = a.sinks ? to_f(((const T *)a.sinks)[h]) : -INFINITY, l = a.sinks ? 1.0f : 0.0f;
    for (int j0 = 0; j0 < block_vis; j0 += FA_TILE) {
        __syncthreads(); /* the previous tile is no longer read */
        fa_load_tile(Ks, kb, a.k_stride, j0, Tk, D, pitch);
        fa_load_tile(Vs, vb, a.v_stride, j0, Tk, Dv, pitch);
        __syncthreads();
        if (j0 < vis) { /* the same for the whole warp; key j0 is visible, so bm is finite */
            const int j = j0 + lane;
            float s = -INFINITY;
            if (j < vis) {
                float dot = 0.0f;
                for (int d = 0; d < D; d++)
                    dot += qs[d] * Ks[lane * pitch + d];
                s = a.scale * dot;
            }
            const float mnew = fmaxf(m, warp_max(s));
            const float corr = expf(m - mnew); /* 0 on the first tile, where m = -inf */
            const float p = j < vis ? expf(s - mnew) : 0.0f;
            l = l * corr + warp_sum(p);
            ps[lane] = p;
            __syncwarp();
            for (int d = lane; d < Dv; d += 32) {
                float x = acc[d] * corr;
                for (int jj = 0; jj < FA_TILE; jj++)
                    x += ps[jj] * Vs[jj * pitch + d];
                acc[d] = x;
            }
            __syncwarp(); /* ps is rewritten by the next tile */
            m = mnew;
        }
    }
    if (active) {
        T *o = (T *)a.out + ((size_t)b * Tq + t) * ((size_t)H * Dv) + (size_t)h * Dv;
        const float inv = 1.0f / l; /* l >= 1: the row's maximum (or sink) gives exp(0) */
        for (int d = lane; d < Dv; d += 32)
            o[d] = from_f<T>(acc[d] * inv);
        if (lane == 0)
            a.lse[(size_t)bh * Tq + t] = m + logf(l);
    }
}

/* dq of FA_WARPS query rows of one (b, h), and drow = rowsum(dO * O) for the dk/dv kernel:
 * with p = exp(scale q.k - lse) and ds = p (dO.v - drow) scale, dq = sum over keys of ds k. */
template <typename T> __global__ void flash_bwd_dq_kernel(KernAttnBwd a)
{
    const int Tq = a.Tq, Tk = a.Tk, H = a.H, D = a.D, rep = a.H / a.KV;
    const int Dv = attn_dv(D, a.Dv), Dm = D > Dv ? D : Dv, pitch = fa_pitch(Dm);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / rep;
    const int t0 = blockIdx.x * FA_WARPS, t = t0 + warp;
    const int last = (t0 + FA_WARPS < Tq ? t0 + FA_WARPS : Tq) - 1;
    const int active = t < Tq;
    float *Ks = dyn_smem<float>(), *Vs = Ks + FA_TILE * pitch;
    float *base = Vs + FA_TILE * pitch;
    float *qs = base + warp * Dm, *dos = base + FA_WARPS * Dm + warp * Dm;
    float *dqs = base + 2 * FA_WARPS * Dm + warp * Dm, *ps = base + 3 * FA_WARPS * Dm + warp * FA_TILE;
    /* dq = dS K reduces over the keys: K's column-wise copy (MXFP8), a tile of its own after
     * the others (fa_dq_smem's extra) */
    float *Kc = a.k_col ? base + 3 * FA_WARPS * Dm + FA_WARPS * FA_TILE : Ks;
    const T *kb = (const T *)a.k + (size_t)b * Tk * a.k_stride + (size_t)g * D;
    const T *kcb = (const T *)attn_second(a.k, a.k_col) + (size_t)b * Tk * a.k_stride + (size_t)g * D;
    const T *vb = (const T *)a.v + (size_t)b * Tk * a.v_stride + (size_t)g * Dv;
    float dr = 0.0f, lse = 0.0f;
    if (active) {
        const size_t tok = (size_t)b * Tq + t, ov = (size_t)h * Dv, ldo = (size_t)H * Dv;
        const T *qr = (const T *)a.q + tok * a.q_stride + (size_t)h * D;
        const T *dor = (const T *)a.dout + tok * ldo + ov;
        const T *orow = (const T *)a.out + tok * ldo + ov;
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) {
            qs[d] = to_f(qr[d]);
            dqs[d] = 0.0f;
        }
        for (int d = lane; d < Dv; d += 32) {
            dos[d] = to_f(dor[d]);
            s += dos[d] * to_f(orow[d]);
        }
        dr = warp_sum(s);
        lse = a.lse[(size_t)bh * Tq + t];
        if (lane == 0)
            a.drow[(size_t)bh * Tq + t] = dr;
    }
    const int vis = active ? attn_visible(a.q_offset, t, Tk) : 0;
    const int block_vis = attn_visible(a.q_offset, last, Tk);
    for (int j0 = 0; j0 < block_vis; j0 += FA_TILE) {
        __syncthreads();
        fa_load_tile(Ks, kb, a.k_stride, j0, Tk, D, pitch);
        fa_load_tile(Vs, vb, a.v_stride, j0, Tk, Dv, pitch);
        if (a.k_col)
            fa_load_tile(Kc, kcb, a.k_stride, j0, Tk, D, pitch);
        __syncthreads();
        if (j0 < vis) {
            float ds = 0.0f;
            if (j0 + lane < vis) {
                float sq = 0.0f, sv = 0.0f;
                for (int d = 0; d < D; d++)
                    sq += qs[d] * Ks[lane * pitch + d];
                for (int d = 0; d < Dv; d++)
                    sv += dos[d] * Vs[lane * pitch + d];
                const float p = expf(a.scale * sq - lse);
                ds = p * (sv - dr) * a.scale;
            }
            ps[lane] = ds;
            __syncwarp();
            for (int d = lane; d < D; d += 32) {
                float x = dqs[d];
                for (int jj = 0; jj < FA_TILE; jj++)
                    x += ps[jj] * Kc[jj * pitch + d];
                dqs[d] = x;
            }
            __syncwarp();
        }
    }
    if (active) {
        T *dqr = (T *)a.dq + ((size_t)b * Tq + t) * a.dq_stride + (size_t)h * D;
        for (int d = lane; d < D; d += 32)
            dqr[d] = from_f<T>(dqs[d]);
    }
}

/* dk and dv of FA_WARPS key rows of one (b, g), summed over the rep heads of the group and the
 * queries that see the key (t >= j - q_offset), in tiles of FA_TILE queries:
 * dk = sum of ds q, dv = sum of p dO. Overwrites dk and dv (zeros for keys no query sees). */
template <typename T> __global__ void flash_bwd_dkdv_kernel(KernAttnBwd a)
{
    const int Tq = a.Tq, Tk = a.Tk, H = a.H, KV = a.KV, D = a.D, rep = a.H / a.KV;
    const int Dv = attn_dv(D, a.Dv), Dm = D > Dv ? D : Dv, pitch = fa_pitch(Dm);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int bg = blockIdx.y, b = bg / KV, g = bg % KV;
    const int j0b = blockIdx.x * FA_WARPS, j = j0b + warp;
    const int active = j < Tk;
    float *Qs = dyn_smem<float>(), *dOs = Qs + FA_TILE * pitch;
    float *base = dOs + FA_TILE * pitch;
    float *ks = base + warp * Dm, *vs = base + FA_WARPS * Dm + warp * Dm;
    float *dks = base + 2 * FA_WARPS * Dm + warp * Dm, *dvs = base + 3 * FA_WARPS * Dm + warp * Dm;
    float *ps = base + 4 * FA_WARPS * Dm + warp * FA_TILE;
    float *dss = base + 4 * FA_WARPS * Dm + FA_WARPS * FA_TILE + warp * FA_TILE;
    float *lses = base + 4 * FA_WARPS * Dm + 2 * FA_WARPS * FA_TILE, *drs = lses + FA_TILE;
    /* dk = dS^T Q and dv = P^T dO reduce over the queries: Q's and dO's column-wise copies
     * (MXFP8), tiles of their own after the others (fa_dkdv_smem's extra) */
    float *Qc = a.q_col ? drs + FA_TILE : Qs;
    float *dOc = a.dout_col ? drs + FA_TILE + (a.q_col ? FA_TILE * pitch : 0) : dOs;
    if (active) {
        const size_t tok = (size_t)b * Tk + j;
        const T *kr = (const T *)a.k + tok * a.k_stride + (size_t)g * D;
        const T *vr = (const T *)a.v + tok * a.v_stride + (size_t)g * Dv;
        for (int d = lane; d < D; d += 32) {
            ks[d] = to_f(kr[d]);
            dks[d] = 0.0f;
        }
        for (int d = lane; d < Dv; d += 32) {
            vs[d] = to_f(vr[d]);
            dvs[d] = 0.0f;
        }
    }
    // the first query that sees key j is t = j - q_offset; the block starts at its first key's
    const long long first = (long long)j0b - a.q_offset;
    const int t_block = first > 0 ? (int)first : 0;
    const long long mine = (long long)j - a.q_offset;
    const int t_first = mine > 0 ? (int)mine : 0;
    const size_t ldo = (size_t)H * Dv;
    for (int r = 0; r < rep; r++) {
        const int h = g * rep + r;
        const size_t bh = (size_t)b * H + h;
        const size_t qo = (size_t)b * Tq * a.q_stride + (size_t)h * D;
        const size_t oo = (size_t)b * Tq * ldo + (size_t)h * Dv;
        const T *qb = (const T *)a.q + qo, *qcb = (const T *)attn_second(a.q, a.q_col) + qo;
        const T *dob = (const T *)a.dout + oo;
        const T *docb = (const T *)attn_second(a.dout, a.dout_col) + oo;
        for (int t0 = t_block; t0 < Tq; t0 += FA_TILE) {
            __syncthreads();
            fa_load_tile(Qs, qb, a.q_stride, t0, Tq, D, pitch);
            fa_load_tile(dOs, dob, (int)ldo, t0, Tq, Dv, pitch);
            if (a.q_col)
                fa_load_tile(Qc, qcb, a.q_stride, t0, Tq, D, pitch);
            if (a.dout_col)
                fa_load_tile(dOc, docb, (int)ldo, t0, Tq, Dv, pitch);
            for (int i = threadIdx.x; i < FA_TILE; i += blockDim.x) {
                const int t = t0 + i;
                lses[i] = t < Tq ? a.lse[bh * Tq + t] : 0.0f;
                drs[i] = t < Tq ? a.drow[bh * Tq + t] : 0.0f;
            }
            __syncthreads();
            if (active && t0 + FA_TILE > t_first) { /* the same for the whole warp */
                const int t = t0 + lane;
                float p = 0.0f, ds = 0.0f;
                if (t < Tq && t >= t_first) {
                    float sq = 0.0f, sv = 0.0f;
                    for (int d = 0; d < D; d++)
                        sq += Qs[lane * pitch + d] * ks[d];
                    for (int d = 0; d < Dv; d++)
                        sv += dOs[lane * pitch + d] * vs[d];
                    p = expf(a.scale * sq - lses[lane]);
                    ds = p * (sv - drs[lane]) * a.scale;
                }
                ps[lane] = p;
                dss[lane] = ds;
                __syncwarp();
                for (int d = lane; d < D; d += 32) {
                    float xk = dks[d];
                    for (int i = 0; i < FA_TILE; i++)
                        xk += dss[i] * Qc[i * pitch + d];
                    dks[d] = xk;
                }
                for (int d = lane; d < Dv; d += 32) {
                    float xv = dvs[d];
                    for (int i = 0; i < FA_TILE; i++)
                        xv += ps[i] * dOc[i * pitch + d];
                    dvs[d] = xv;
                }
                __syncwarp();
            }
        }
    }
    if (active) {
        const size_t tok = (size_t)b * Tk + j;
        T *dkr = (T *)a.dk + tok * a.dk_stride + (size_t)g * D;
        T *dvr = (T *)a.dv + tok * a.dv_stride + (size_t)g * Dv;
        for (int d = lane; d < D; d += 32)
            dkr[d] = from_f<T>(dks[d]);
        for (int d = lane; d < Dv; d += 32)
            dvr[d] = from_f<T>(dvs[d]);
    }
}

/* The wider of the query/key and value head widths: what the shared buffers are sized by. */
static int attn_dm(int D, int Dv) { return attn_dv(D, Dv) > D ? attn_dv(D, Dv) : D; }

static size_t fa_fwd_smem(int D)
{
    return ((size_t)2 * FA_TILE * fa_pitch(D) + (size_t)2 * FA_WARPS * D + FA_WARPS * FA_TILE) *
           sizeof(float);
}

/* extra: the tiles of MXFP8's column-wise copies (KernAttnBwd's k_col; q_col, dout_col), one
 * each, after the others */
static size_t fa_dq_smem(int D, int extra)
{
    return ((size_t)(2 + extra) * FA_TILE * fa_pitch(D) + (size_t)3 * FA_WARPS * D +
            FA_WARPS * FA_TILE) *
           sizeof(float);
}

static size_t fa_dkdv_smem(int D, int extra)
{
    return ((size_t)(2 + extra) * FA_TILE * fa_pitch(D) + (size_t)4 * FA_WARPS * D +
            (size_t)2 * FA_WARPS * FA_TILE + 2 * FA_TILE) *
           sizeof(float);
}

template <typename T> static void attn_fwd_fused(const KernAttnFwd *a)
{
    KERN_CHECK(a->dropout == 0.0f, "attention: dropout needs the unfused path (probs)");
    KERN_CHECK(a->lse != NULL, "attention: the fused path needs lse");
    KERN_CHECK((long long)a->B * a->H <= 65535, "attention: B*H above 65535");
    const size_t smem = fa_fwd_smem(attn_dm(a->D, a->Dv));
    kern_cuda_smem_optin((const void *)flash_fwd_kernel<T>, smem, "fused attention (head dim)");
    KLAUNCH(flash_fwd_kernel<T>, dim3((a->Tq + FA_WARPS - 1) / FA_WARPS, a->B * a->H),
            FA_WARPS * 32, smem, *a);
}

template <typename T> static void attn_bwd_fused(const KernAttnBwd *a)
{
    KERN_CHECK(a->dropout == 0.0f, "attention: dropout needs the unfused path (probs)");
    KERN_CHECK(a->lse && a->drow && a->out, "attention: the fused backward needs out, lse, drow");
    KERN_CHECK((long long)a->B * a->H <= 65535, "attention: B*H above 65535");
    if (a->Tq > 0) { /* dq and drow first: the dk/dv kernel reads drow */
        const size_t smem = fa_dq_smem(attn_dm(a->D, a->Dv), a->k_col != NULL);
        kern_cuda_smem_optin((const void *)flash_bwd_dq_kernel<T>, smem,
                             "fused attention backward (head dim)");
        KLAUNCH(flash_bwd_dq_kernel<T>, dim3((a->Tq + FA_WARPS - 1) / FA_WARPS, a->B * a->H),
                FA_WARPS * 32, smem, *a);
    }
    const size_t smem = fa_dkdv_smem(attn_dm(a->D, a->Dv), (a->q_col != NULL) + (a->dout_col != NULL));
    kern_cuda_smem_optin((const void *)flash_bwd_dkdv_kernel<T>, smem,
                         "fused attention backward (head dim)");
    KLAUNCH(flash_bwd_dkdv_kernel<T>, dim3((a->Tk + FA_WARPS - 1) / FA_WARPS, a->B * a->KV),
            FA_WARPS * 32, smem, *a);
}

template <typename T> static void attention_fwd(const KernAttnFwd *a)
{
    attn_check(a->B, a->Tq, a->Tk, a->H, a->KV, a->D, attn_dv(a->D, a->Dv), a->q_offset,
               a->q_stride, a->k_stride, a->v_stride);
    if (a->B == 0 || a->Tq == 0)
        return;
    if (a->probs)
        attn_fwd_unfused<T>(a);
    else
        attn_fwd_fused<T>(a);
}

template <typename T> static void attention_bwd(const KernAttnBwd *a)
{
    const int Dv = attn_dv(a->D, a->Dv);
    attn_check(a->B, a->Tq, a->Tk, a->H, a->KV, a->D, Dv, a->q_offset, a->q_stride, a->k_stride,
               a->v_stride);
    attn_check(a->B, a->Tq, a->Tk, a->H, a->KV, a->D, Dv, a->q_offset, a->dq_stride, a->dk_stride,
               a->dv_stride);
    if (a->B == 0 || a->Tk == 0)
        return;
    if (a->probs) {
        // dk and dv are overwritten (even with no queries) but summed over a group's heads
        zero_rows<T>(a->dk, (size_t)a->B * a->Tk, a->KV * a->D, a->dk_stride);
        zero_rows<T>(a->dv, (size_t)a->B * a->Tk, a->KV * Dv, a->dv_stride);
        if (a->Tq > 0)
            attn_bwd_unfused<T>(a);
    } else {
        attn_bwd_fused<T>(a); /* writes every dk, dv row, zeros where no query looks */
    }
}

/* Milakov & Gimelshein 2018's online softmax for context parallelism's ring, as the CPU's
 * kern_cpu_attention_merge: a thread per (head, query), which reads both log-sum-exps, weighs
 * the row's D values and writes the merged log-sum-exp (no other thread reads it). fp32
 * arithmetic; the merged row is rounded once to the act type. */
template <typename T>
__global__ void attention_merge_kernel(T *out, float *lse, const T *out_b, const float *lse_b,
                                       int Tq, int H, int D)
{
    const size_t n = (size_t)Tq * H;
    GRID_STRIDE(i, n) {
        const int h = (int)(i / (size_t)Tq), t = (int)(i % (size_t)Tq);
        const float a = lse[i], b = lse_b[i], m = fmaxf(a, b);
        const float L = m + logf(expf(a - m) + expf(b - m));
        const float wa = expf(a - L), wb = expf(b - L);
        T *row = out + ((size_t)t * H + h) * D;
        const T *rb = out_b + ((size_t)t * H + h) * D;
        for (int d = 0; d < D; d++)
            row[d] = from_f<T>(wa * to_f(row[d]) + wb * to_f(rb[d]));
        lse[i] = L;
    }
}

template <typename T>
static void attention_merge(void *out, float *lse, const void *out_b, const float *lse_b, int Tq,
                            int H, int D)
{
    KERN_CHECK(Tq >= 0 && H > 0 && D > 0, "attention_merge: bad shape");
    const size_t n = (size_t)Tq * H;
    if (n)
        KLAUNCH_N(attention_merge_kernel<T>, n, (T *)out, lse, (const T *)out_b, lse_b, Tq, H, D);
}

template <typename T> static void fill(KernBackend *k)
{
    k->attention_fwd = attention_fwd<T>;
    k->attention_bwd = attention_bwd<T>;
    k->attention_merge = attention_merge<T>;
}

void kern_cuda_table_attention(KernBackend *k)
{
    if (k->act == PX_FP32)
        fill<float>(k);
    else if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
}
