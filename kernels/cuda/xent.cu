/* Softmax cross-entropy over fp32 logits in the steps of kernels/cpu/xent.c (Megatron's
 * vocabulary-parallel cross-entropy: the caller all-reduces between them). One block per row:
 * a row is a whole vocabulary shard (tens of thousands of logits). */
#include "kernels/cuda/common.cuh"

enum { XENT_THREADS = 256 };

__global__ void xent_rowmax_kernel(float *rowmax, const float *logits, int V)
{
    // rowmax is (N), logits (N,V); block n does row n
    const float *row = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY; /* an empty shard must not win the max over the TP group */
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        m = fmaxf(m, row[i]);
    m = block_max(m);
    if (threadIdx.x == 0)
        rowmax[blockIdx.x] = m;
}

__global__ void xent_expsum_kernel(float *rowsum, float *target, float *logits,
                                   const float *rowmax, const int32_t *targets, int V,
                                   int v_start)
{
    float *row = logits + (size_t)blockIdx.x * V;
    const long long local = (long long)targets[blockIdx.x] - v_start;
    // the raw logit, read before the row is overwritten
    float tgt = 0.0f;
    if (threadIdx.x == 0 && local >= 0 && local < V)
        tgt = row[local];
    __syncthreads();
    const float m = rowmax[blockIdx.x];
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float e = expf(row[i] - m);
        row[i] = e;
        s += e;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        rowsum[blockIdx.x] = s;
        target[blockIdx.x] = tgt;
    }
}

__global__ void xent_finish_kernel(float *loss, float *probs, const float *rowsum,
                                   const float *rowmax, const float *target, int V)
{
    float *row = probs + (size_t)blockIdx.x * V;
    const float inv = 1.0f / rowsum[blockIdx.x];
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        row[i] *= inv;
    // -log softmax(target) = log(sum exp(l - m)) + m - l_target
    if (threadIdx.x == 0)
        loss[blockIdx.x] = (float)(log((double)rowsum[blockIdx.x]) + rowmax[blockIdx.x] -
                                   target[blockIdx.x]);
}

__global__ void xent_bwd_kernel(float *probs, const int32_t *targets, int V, int v_start,
                                float dloss)
{
    float *row = probs + (size_t)blockIdx.x * V;
    const long long local = (long long)targets[blockIdx.x] - v_start;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        row[i] = (row[i] - (i == local ? 1.0f : 0.0f)) * dloss;
}

static void xent_rowmax(float *rowmax, const float *logits, int N, int V)
{
    if (N > 0)
        KLAUNCH(xent_rowmax_kernel, N, XENT_THREADS, 0, rowmax, logits, V);
}

static void xent_expsum(float *rowsum, float *target, float *logits, const float *rowmax,
                        const int32_t *targets, int N, int V, int v_start)
{
    if (N > 0)
        KLAUNCH(xent_expsum_kernel, N, XENT_THREADS, 0, rowsum, target, logits, rowmax, targets, V,
                v_start);
}

static void xent_finish(float *loss, float *probs, const float *rowsum, const float *rowmax,
                        const float *target, int N, int V)
{
    if (N > 0)
        KLAUNCH(xent_finish_kernel, N, XENT_THREADS, 0, loss, probs, rowsum, rowmax, target, V);
}

static void xent_bwd(float *probs, const int32_t *targets, int N, int V, int v_start, float dloss)
{
    if (N > 0)
        KLAUNCH(xent_bwd_kernel, N, XENT_THREADS, 0, probs, targets, V, v_start, dloss);
}

void kern_cuda_table_xent(KernBackend *k)
{
    k->xent_rowmax = xent_rowmax;
    k->xent_expsum = xent_expsum;
    k->xent_finish = xent_finish;
    k->xent_bwd = xent_bwd;
}
