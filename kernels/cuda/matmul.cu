/* Matrix products on cuBLAS (bf16/fp16/fp32 inputs, fp32 accumulation, C in the act dtype or
 * fp32; fp32 inputs in full fp32, never TF32: context.cu's math mode),
 * and the bias add and bias gradient of a linear layer.
 *
 * kernels.h is row-major and cuBLAS column-major. A row-major [r,c] matrix read as
 * column-major is its transpose, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the
 * operands swap places, m and n swap, and each keeps its own transpose flag and row length. */
#include "kernels/cuda/common.cuh"

void kern_cuda_gemm(void *c, cudaDataType c_type, int ldc, long long stride_c, const void *a,
                    int lda, long long stride_a, const void *b, int ldb, long long stride_b,
                    cudaDataType ab_type, int m, int n, int k, int trans_a, int trans_b,
                    float alpha, float beta, int batch)
{
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasHandle_t h = kern_cuda_ctx()->blas;
    if (batch == 1)
        cublasCheck(cublasGemmEx(h, op_b, op_a, n, m, k, &alpha, b, ab_type, ldb, a, ab_type, lda,
                                 &beta, c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        cublasCheck(cublasGemmStridedBatchedEx(h, op_b, op_a, n, m, k, &alpha, b, ab_type, ldb,
                                               stride_b, a, ab_type, lda, stride_a, &beta, c,
                                               c_type, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT));
}

/* c = beta * c for an empty product (k = 0), which cuBLAS would reject for its leading
 * dimensions; beta = 0 writes zeros without reading c, as a GEMM would. */
template <typename C>
__global__ void scale_kernel(C *c, size_t n, float beta)
{
    GRID_STRIDE(i, n)
        c[i] = from_f<C>(beta == 0.0f ? 0.0f : beta * to_f(c[i]));
}

template <typename T>
static void matmul(void *c, PxDtype c_dtype, const void *a, const void *b, int m, int n, int k,
                   int trans_a, int trans_b, float alpha, float beta)
{
    // c is (m,n); a is (m,k), or (k,m) when trans_a; b is (k,n), or (n,k) when trans_b
    KERN_CHECK(c_dtype == ActTraits<T>::px || c_dtype == PX_FP32,
               "matmul: c_dtype must be the act dtype or fp32");
    KERN_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: negative size");
    if (m == 0 || n == 0)
        return;
    const size_t mn = (size_t)m * n;
    if (k == 0) {
        if (c_dtype == PX_FP32)
            KLAUNCH(scale_kernel<float>, kern_grid(mn, KERN_THREADS), KERN_THREADS, 0, (float *)c,
                    mn, beta);
        else
            KLAUNCH(scale_kernel<T>, kern_grid(mn, KERN_THREADS), KERN_THREADS, 0, (T *)c, mn,
                    beta);
        return;
    }
    kern_cuda_gemm(c, c_dtype == PX_FP32 ? CUDA_R_32F : ActTraits<T>::blas, n, 0, a,
                   trans_a ? m : k, 0, b, trans_b ? k : n, 0, ActTraits<T>::blas, m, n, k,
                   trans_a, trans_b, alpha, beta, 1);
}

template <typename T>
__global__ void add_bias_kernel(T *out, const T *bias, size_t n, int C)
{
    // out is (N,C) flattened to n; bias is (C)
    GRID_STRIDE(i, n)
        out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % C]));
}

template <typename T>
static void add_bias(void *out, const void *bias, int N, int C)
{
    const size_t n = (size_t)N * C;
    if (n == 0)
        return;
    KLAUNCH(add_bias_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)out,
            (const T *)bias, n, C);
}

enum { BG_COLS = 32, BG_ROWS = 8 };

/* A block sums a strip of 32 columns over its share of the rows: 32 threads across (a warp
 * reads 32 neighbouring elements of a row), 8 rows at a time down; the 8 partial sums of a
 * column meet in shared memory, and one atomic per column and block adds them to dbias. With
 * 16-bit gradients one block sums all the rows of its strip and adds each column once. */
template <typename T, typename G>
__global__ void bias_grad_kernel(G *dbias, const T *dout, int N, int C)
{
    // dbias is (C); dout is (N,C)
    __shared__ float part[BG_ROWS][BG_COLS + 1];
    const int col = blockIdx.x * BG_COLS + threadIdx.x;
    float s = 0.0f;
    if (col < C)
        for (int r = blockIdx.y * BG_ROWS + threadIdx.y; r < N; r += gridDim.y * BG_ROWS)
            s += to_f(dout[(size_t)r * C + col]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        float t = 0.0f;
        for (int i = 0; i < BG_ROWS; i++)
            t += part[i][threadIdx.x];
        grad_add(&dbias[col], t);
    }
}

template <typename T, typename G>
static void bias_grad(void *dbias, const void *dout, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    const int strips = (C + BG_COLS - 1) / BG_COLS;
    // row splits: enough blocks to fill the device, each with at least 64 rows to sum
    int splits = 4 * kern_cuda_ctx()->sms / strips;
    const int most = (N + 63) / 64;
    splits = splits > most ? most : splits;
    splits = splits < 1 || sizeof(G) < sizeof(float) ? 1 : splits > 65535 ? 65535 : splits;
    KLAUNCH((bias_grad_kernel<T, G>), dim3(strips, splits), dim3(BG_COLS, BG_ROWS), 0, (G *)dbias,
            (const T *)dout, N, C);
}

template <typename T, typename G> static void fill(KernBackend *k)
{
    k->matmul = matmul<T>;
    k->add_bias = add_bias<T>;
    k->bias_grad = bias_grad<T, G>;
}

void kern_cuda_table_matmul(KernBackend *k)
{
    // gradients in fp32 or in the act dtype (KernBackend.grad); fp32 activations, fp32 ones
    if (k->act == PX_FP32)
        fill<float, float>(k);
    else if (k->act == PX_BF16)
        k->grad == PX_FP32 ? fill<__nv_bfloat16, float>(k) : fill<__nv_bfloat16, __nv_bfloat16>(k);
    else
        k->grad == PX_FP32 ? fill<__half, float>(k) : fill<__half, __half>(k);
}
