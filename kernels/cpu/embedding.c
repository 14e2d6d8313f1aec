/* Token and learned-position embedding, vocabulary-parallel (Megatron's VocabParallelEmbedding):
 * a TP rank holds rows v_start .. v_start+V-1 of wte and writes zeros for the other tokens, so
 * the sum over the TP group (an all-reduce) is the full lookup. */
#include <string.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_embedding_fwd(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                            int N, int T, int pos_offset, int C, int v_start, int V)
{
    // out is (N,C), tokens (N), wte (V,C), wpe (at least pos_offset+T, C)
    float *o = out;
    const float *te = wte, *pe = wpe;
    KERN_CHECK(T > 0 || !pe, "embedding: positions need T > 0");
    for (int n = 0; n < N; n++) {
        float *orow = o + (size_t)n * C;
        // the difference in 64 bits: a token near INT32_MIN minus v_start must not wrap
        int64_t local = (int64_t)tokens[n] - v_start;
        if (local >= 0 && local < V)
            memcpy(orow, te + (size_t)local * C, (size_t)C * sizeof *orow);
        else
            memset(orow, 0, (size_t)C * sizeof *orow);
        if (pe) {
            const float *prow = pe + (size_t)(pos_offset + n % T) * C;
            for (int c = 0; c < C; c++)
                orow[c] += prow[c];
        }
    }
}

void kern_cpu_embedding_bwd(void *dwte_out, void *dwpe_out, const void *dout,
                            const int32_t *tokens, int N, int T, int pos_offset, int C, int v_start,
                            int V)
{
    float *dwte = dwte_out, *dwpe = dwpe_out; /* the CPU's gradients are fp32 */
    // dwte is (V,C), dwpe (positions, C), dout (N,C), tokens (N)
    const float *d = dout;
    KERN_CHECK(T > 0 || !dwpe, "embedding: positions need T > 0");
    for (int n = 0; n < N; n++) {
        const float *drow = d + (size_t)n * C;
        int64_t local = (int64_t)tokens[n] - v_start;
        if (local >= 0 && local < V) {
            float *g = dwte + (size_t)local * C;
            for (int c = 0; c < C; c++)
                g[c] += drow[c];
        }
        if (dwpe) {
            float *g = dwpe + (size_t)(pos_offset + n % T) * C;
            for (int c = 0; c < C; c++)
                g[c] += drow[c];
        }
    }
}
