/* Model and spec fixtures shared by the tests: numbers are copied here from the published
 * sources so that no test reads ../shared at run time. */
#ifndef PX_FIXTURES_H
#define PX_FIXTURES_H

#include <stdio.h>
#include <string.h>

#include "sim/sim.h"

/* A GPT-family model as Narayanan et al. 2021 and Korthikanti et al. 2022 describe it:
 * ffn = 4h, a * head_dim = h, learned positions, biases, tied embeddings. */
static inline ModelConfig fx_gpt(int layers, int hidden, int heads, int vocab, int seq)
{
    ModelConfig c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "gpt-l%d-h%d", layers, hidden);
    c.family = MODEL_GPT;
    c.layers = layers;
    c.hidden = hidden;
    c.heads = heads;
    c.kv_heads = heads;
    c.head_dim = hidden / heads;
    c.ffn_hidden = 4 * hidden;
    c.vocab = vocab;
    c.seq_len = seq;
    c.norm = MODEL_LAYERNORM;
    c.mlp = MODEL_GELU;
    c.position = MODEL_POS_LEARNED;
    c.tied_embeddings = 1;
    c.bias = 1;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000;
    return c;
}

static inline ModelSpec fx_spec(ModelConfig c)
{
    ModelSpec s;
    model_spec_defaults(&s);
    s.model = c;
    s.job.precision = PX_BF16;
    return s;
}

#endif
