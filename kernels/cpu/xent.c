/* Softmax cross-entropy over fp32 logits, in steps that a vocabulary-parallel caller separates
 * by all-reduces (Megatron's vocab-parallel cross-entropy): the global row maximum (max), then
 * the row sums of exp and the target logits (sum), then loss and probabilities. On one rank the
 * steps simply follow each other. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_xent_rowmax(float *rowmax, const float *logits, int N, int V)
{
    // rowmax is (N), logits (N,V)
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        float m = -INFINITY; // an empty shard must not win the max over the TP group
        for (int i = 0; i < V; i++)
            m = row[i] > m ? row[i] : m;
        rowmax[n] = m;
    }
}

void kern_cpu_xent_expsum(float *rowsum, float *target, float *logits, const float *rowmax,
                          const int32_t *targets, int N, int V, int v_start)
{
    // rowsum, target, rowmax, targets are (N); logits (N,V), overwritten with exp(logit - max)
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * V;
        int64_t local = (int64_t)targets[n] - v_start;
        // the raw logit, read before the row is overwritten
        target[n] = local >= 0 && local < V ? row[local] : 0.0f;
        const float m = rowmax[n];
        double sum = 0.0;
        for (int i = 0; i < V; i++) {
            row[i] = expf(row[i] - m);
            sum += row[i];
        }
        rowsum[n] = (float)sum;
    }
}

void kern_cpu_xent_finish(float *loss, float *probs, const float *rowsum, const float *rowmax,
                          const float *target, int N, int V)
{
    // loss, rowsum, rowmax, target are (N); probs (N,V), exp in, probabilities out
    for (int n = 0; n < N; n++) {
        float *row = probs + (size_t)n * V;
        const float inv = 1.0f / rowsum[n];
        for (int i = 0; i < V; i++)
            row[i] *= inv;
        // -log softmax(target) = log(sum exp(l - m)) + m - l_target
        loss[n] = (float)(log((double)rowsum[n]) + rowmax[n] - target[n]);
    }
}

void kern_cpu_xent_bwd(float *probs, const int32_t *targets, int N, int V, int v_start,
                       float dloss)
{
    // probs is (N,V), becomes dlogits; targets (N)
    for (int n = 0; n < N; n++) {
        float *row = probs + (size_t)n * V;
        int64_t local = (int64_t)targets[n] - v_start;
        for (int i = 0; i < V; i++)
            row[i] = (row[i] - (i == local ? 1.0f : 0.0f)) * dloss;
    }
}
