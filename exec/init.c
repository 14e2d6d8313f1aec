/* Initial weights that do not depend on the layout: each element's value is a function of
 * (seed, the full parameter's name, the element's index in the full tensor), drawn from a
 * counter-based generator, so a run sharded over TP, PP or DP ranks starts from the same model
 * as a single rank. GPT-2's scheme (Radford et al. 2019, as nanoGPT and llm.c apply it):
 * normal(0, 0.02) for matrices and embeddings, the residual output projections (attn.proj.w,
 * mlp.fc2.w) scaled by 1/sqrt(2 * layers), biases 0, norm weights 1. */
#include <math.h>
#include <string.h>

#include "exec/internal.h"

#define EXEC_TWO_PI 6.283185307179586476925

/* splitmix64's finalizer (Steele et al. 2014): a bijection that scatters nearby counters. */
uint64_t exec_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* FNV-1a of the name, mixed with the seed: the key of a parameter's stream. */
uint64_t exec_hash_name(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return exec_mix64(exec_mix64(seed) ^ h);
}

/* Box-Muller on the pair index / 2: the even element takes the cosine, the odd one the sine,
 * so every element is still a function of its own index alone. */
double exec_init_normal(uint64_t seed, const char *name, uint64_t index)
{
    uint64_t key = exec_hash_name(seed, name), pair = index >> 1;
    uint64_t a = exec_mix64(key ^ exec_mix64(2 * pair));
    uint64_t b = exec_mix64(key ^ exec_mix64(2 * pair + 1));
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0); /* (0, 1] */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);         /* [0, 1) */
    double r = sqrt(-2.0 * log(u1));
    return (index & 1) ? r * sin(EXEC_TWO_PI * u2) : r * cos(EXEC_TWO_PI * u2);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Same key derivation as exec_init_normal, hoisted out of the element loop. */
static void fill_normal(float *w, uint64_t seed, const char *name, uint64_t n, double std)
{
    uint64_t key = exec_hash_name(seed, name);
    for (uint64_t i = 0; i < n; i += 2) {
        uint64_t pair = i >> 1;
        uint64_t a = exec_mix64(key ^ exec_mix64(2 * pair));
        uint64_t b = exec_mix64(key ^ exec_mix64(2 * pair + 1));
        double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1));
        w[i] = (float)(std * r * cos(EXEC_TWO_PI * u2));
        if (i + 1 < n)
            w[i + 1] = (float)(std * r * sin(EXEC_TWO_PI * u2));
    }
}

void exec_init_params(Exec *ex)
{
    const ModelConfig *c = &ex->spec.model;
    const uint64_t seed = ex->spec.job.seed;
    const double std = 0.02, resid = 0.02 / sqrt(2.0 * c->layers);
    for (int i = 0; i < ex->n_params; i++) {
        const ExecParam *p = &ex->params[i];
        const ModelTensor *t = &ex->tt.t[p->tensor];
        const char *name = t->name;
        if (ends_with(name, ".b")) {
            ex->k->memset0(p->w, p->numel * sizeof(float));
        } else if (ends_with(name, "ln1.w") || ends_with(name, "ln2.w") ||
                   !strcmp(name, "final_ln.w")) {
            for (uint64_t j = 0; j < p->numel; j++)
                p->w[j] = 1.0f;
        } else if (!strcmp(name, "embed.wte") || !strcmp(name, "logits.w")) {
            /* rows of the vocabulary padding stay 0: their logits are masked anyway, and the
             * padding depends on tp */
            uint64_t real = (uint64_t)c->vocab * (uint64_t)t->shape[1];
            fill_normal(p->w, seed, name, real < p->numel ? real : p->numel, std);
            if (real < p->numel)
                ex->k->memset0(p->w + real, (p->numel - real) * sizeof(float));
        } else {
            int out_proj = ends_with(name, "attn.proj.w") || ends_with(name, "mlp.fc2.w");
            fill_normal(p->w, seed, name, p->numel, out_proj ? resid : std);
        }
    }
}
