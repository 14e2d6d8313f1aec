/* Model configurations: parallax model JSON, Hugging Face config.json import, the zoo. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

extern const PxEmbedded model_zoo_data[];
extern const int model_zoo_data_count;

static const char *const family_names[] = {"gpt", "llama"};
static const char *const norm_names[] = {"layernorm", "rmsnorm"};
static const char *const mlp_names[] = {"gelu", "swiglu"};
static const char *const position_names[] = {"learned", "rope"};
static const char *const score_names[] = {"softmax", "sigmoid"};
static const char *const rope_scaling_names[] = {"none", "llama3"};

const char *model_family_name(ModelFamily f) { return f == MODEL_LLAMA ? "llama" : "gpt"; }

const char *model_rope_scaling_name(ModelRopeScalingType t)
{
    return (unsigned)t < 2 ? rope_scaling_names[t] : "?";
}

int model_rope_scaling_megatron(const ModelConfig *c)
{
    const ModelRopeScaling *r = &c->rope_scaling;
    return r->type == MODEL_ROPE_SCALING_LLAMA3 && r->low_freq_factor == 1.0 &&
           r->high_freq_factor == 4.0 && r->original_context == 8192;
}

int model_zoo_count(void) { return model_zoo_data_count; }

const char *model_zoo_name(int i)
{
    return i >= 0 && i < model_zoo_data_count ? model_zoo_data[i].name : NULL;
}

const char *model_zoo_text(const char *name)
{
    for (int i = 0; name && i < model_zoo_data_count; i++)
        if (strcmp(model_zoo_data[i].name, name) == 0)
            return model_zoo_data[i].text;
    return NULL;
}

/* Llama's MLP width when a config leaves it out: 2/3 of 4h rounded up to a multiple of 256,
 * as Meta's reference code does (multiple_of = 256). */
static int llama_default_ffn(int hidden)
{
    int f = 2 * (4 * hidden) / 3;
    return (f + 255) / 256 * 256;
}

static void family_defaults(ModelConfig *c)
{
    if (c->family == MODEL_LLAMA) {
        c->norm = MODEL_RMSNORM;
        c->mlp = MODEL_SWIGLU;
        c->position = MODEL_POS_ROPE;
        c->tied_embeddings = 0;
        c->bias = 0;
        c->norm_eps = 1e-5;
        c->rope_theta = 10000.0;
    } else {
        c->norm = MODEL_LAYERNORM;
        c->mlp = MODEL_GELU;
        c->position = MODEL_POS_LEARNED;
        c->tied_embeddings = 1;
        c->bias = 1;
        c->norm_eps = 1e-5;
        c->rope_theta = 10000.0;
    }
    c->qkv_bias = 0;
}

int model_config_check(const ModelConfig *c, const char *origin, PxError *err)
{
    if (c->layers < 1)
        return px_fail(err, PX_EINPUT, "%s: layers must be at least 1, got %d", origin, c->layers);
    if (c->hidden < 1)
        return px_fail(err, PX_EINPUT, "%s: hidden must be at least 1, got %d", origin, c->hidden);
    if (c->heads < 1)
        return px_fail(err, PX_EINPUT, "%s: heads must be at least 1, got %d", origin, c->heads);
    if (c->kv_heads < 1 || c->kv_heads > c->heads || c->heads % c->kv_heads != 0)
        return px_fail(err, PX_EINPUT, "%s: kv_heads %d must divide heads %d", origin, c->kv_heads,
                       c->heads);
    if (c->head_dim < 1)
        return px_fail(err, PX_EINPUT, "%s: head_dim must be at least 1, got %d", origin,
                       c->head_dim);
    if (c->position == MODEL_POS_ROPE && c->head_dim % 2 != 0)
        return px_fail(err, PX_EINPUT, "%s: rotary positions need an even head_dim, got %d",
                       origin, c->head_dim);
    if (c->ffn_hidden < 1)
        return px_fail(err, PX_EINPUT, "%s: ffn_hidden must be at least 1, got %d", origin,
                       c->ffn_hidden);
    if (c->vocab < 2)
        return px_fail(err, PX_EINPUT, "%s: vocab must be at least 2, got %d", origin, c->vocab);
    if (c->seq_len < 1)
        return px_fail(err, PX_EINPUT, "%s: seq_len must be at least 1, got %d", origin,
                       c->seq_len);
    if (!(c->norm_eps > 0))
        return px_fail(err, PX_EINPUT, "%s: norm_eps must be positive", origin);
    const ModelMoe *m = &c->moe;
    if (m->experts > 0) {
        if (m->topk < 1 || m->topk > m->experts)
            return px_fail(err, PX_EINPUT, "%s: moe.topk %d must be between 1 and the %d experts",
                           origin, m->topk, m->experts);
        if (m->expert_ffn < 1)
            return px_fail(err, PX_EINPUT, "%s: moe.expert_ffn must be at least 1, got %d", origin,
                           m->expert_ffn);
        if (m->shared_ffn < 0 || m->first_dense < 0 || m->first_dense > c->layers ||
            m->layer_freq < 1)
            return px_fail(err, PX_EINPUT,
                           "%s: moe.shared_ffn %d must be >= 0, moe.first_dense %d between 0 and "
                           "the %d layers, moe.layer_freq %d at least 1",
                           origin, m->shared_ffn, m->first_dense, c->layers, m->layer_freq);
        if (m->groups > 0 && (m->experts % m->groups != 0 || m->topk_groups < 1 ||
                              m->topk_groups > m->groups ||
                              m->topk > m->topk_groups * (m->experts / m->groups)))
            return px_fail(err, PX_EINPUT,
                           "%s: moe.groups %d must divide the %d experts, with moe.topk_groups %d "
                           "between 1 and it holding at least topk %d experts",
                           origin, m->groups, m->experts, m->topk_groups, m->topk);
        if (!(m->capacity_factor >= 0) || !(m->aux_loss_coeff >= 0))
            return px_fail(err, PX_EINPUT,
                           "%s: moe.capacity_factor and moe.aux_loss_coeff must be >= 0", origin);
    } else if (m->experts < 0) {
        return px_fail(err, PX_EINPUT, "%s: moe.experts must be >= 0, got %d", origin, m->experts);
    }
    const ModelMla *a = &c->mla;
    if (a->kv_lora_rank > 0 &&
        (a->q_lora_rank < 0 || a->qk_nope_dim < 1 || a->qk_rope_dim < 1 || a->v_dim < 1 ||
         a->qk_rope_dim % 2 != 0))
        return px_fail(err, PX_EINPUT,
                       "%s: mla needs qk_nope_dim, qk_rope_dim (even), v_dim >= 1 and q_lora_rank "
                       ">= 0",
                       origin);
    /* every head's keys and values come up from the one latent (kv_b): there are no key/value
     * groups to share, so a kv_heads below heads has no meaning (DeepSeek's configs give
     * num_key_value_heads = num_attention_heads) */
    if (a->kv_lora_rank > 0 && c->kv_heads != c->heads)
        return px_fail(err, PX_EINPUT,
                       "%s: kv_heads %d must equal heads %d with multi-head latent attention "
                       "(mla.kv_lora_rank %d): each head's keys and values come up from the "
                       "latent, there are no key/value groups",
                       origin, c->kv_heads, c->heads, a->kv_lora_rank);
    if (c->mtp_layers < 0 || c->mtp_layers > 16)
        return px_fail(err, PX_EINPUT, "%s: mtp_layers must be between 0 and 16, got %d", origin,
                       c->mtp_layers);
    const ModelRopeScaling *r = &c->rope_scaling;
    if (r->type != MODEL_ROPE_SCALING_NONE && c->position != MODEL_POS_ROPE)
        return px_fail(err, PX_EINPUT, "%s: rope_scaling needs rotary positions (position \"rope\")",
                       origin);
    /* transformers' _validate_llama3_parameters: a factor of at least 1, low below high */
    if (r->type == MODEL_ROPE_SCALING_LLAMA3 &&
        (!(r->factor >= 1.0) || !(r->low_freq_factor > 0) ||
         !(r->high_freq_factor > r->low_freq_factor) || r->original_context < 1))
        return px_fail(err, PX_EINPUT,
                       "%s: rope_scaling (llama3) needs factor >= 1, 0 < low_freq_factor < "
                       "high_freq_factor and original_max_position_embeddings >= 1, got factor %g, "
                       "low %g, high %g, original %d",
                       origin, r->factor, r->low_freq_factor, r->high_freq_factor,
                       r->original_context);
    return PX_OK;
}

/* The "moe" and "mla" objects of the parallax format. */
static int parse_native_moe(const cJSON *j, const char *where, ModelConfig *c, PxError *err)
{
    static const char *const moe_keys[] = {
        "experts",   "topk",        "expert_ffn",  "shared_ffn",     "shared_gate",
        "first_dense", "layer_freq", "score",      "groups",         "topk_groups",
        "router_bias", "expert_bias", "norm_topk", "aux_loss_coeff", "capacity_factor", NULL};
    static const char *const mla_keys[] = {"q_lora_rank", "kv_lora_rank", "qk_nope_dim",
                                           "qk_rope_dim", "v_dim", NULL};
    const cJSON *m = NULL, *a = NULL;
    int rc;
    char w[340];
    if ((rc = px_json_object(j, where, "moe", 0, &m, err)) ||
        (rc = px_json_object(j, where, "mla", 0, &a, err)) ||
        (rc = px_json_int(j, where, "mtp_layers", 0, 0, 16, &c->mtp_layers, err)) ||
        (rc = px_json_bool(j, where, "attn_sinks", 0, &c->attn_sinks, err)) ||
        (rc = px_json_bool(j, where, "qk_norm", 0, &c->qk_norm, err)))
        return rc;
    if (m) {
        ModelMoe *o = &c->moe;
        snprintf(w, sizeof w, "%s moe", where);
        px_json_warn_unknown(m, w, moe_keys);
        o->layer_freq = 1;
        o->norm_topk = 1;
        int score = 0;
        if ((rc = px_json_int(m, w, "experts", 1, 1, 1 << 20, &o->experts, err)) ||
            (rc = px_json_int(m, w, "topk", 1, 1, 1 << 20, &o->topk, err)) ||
            (rc = px_json_int(m, w, "expert_ffn", 1, 1, 1 << 24, &o->expert_ffn, err)) ||
            (rc = px_json_int(m, w, "shared_ffn", 0, 0, 1 << 24, &o->shared_ffn, err)) ||
            (rc = px_json_bool(m, w, "shared_gate", 0, &o->shared_gate, err)) ||
            (rc = px_json_int(m, w, "first_dense", 0, 0, 100000, &o->first_dense, err)) ||
            (rc = px_json_int(m, w, "layer_freq", 0, 1, 100000, &o->layer_freq, err)) ||
            (rc = px_json_enum(m, w, "score", 0, score_names, 2, &score, err)) ||
            (rc = px_json_int(m, w, "groups", 0, 0, 1 << 20, &o->groups, err)) ||
            (rc = px_json_int(m, w, "topk_groups", 0, 0, 1 << 20, &o->topk_groups, err)) ||
            (rc = px_json_bool(m, w, "router_bias", 0, &o->router_bias, err)) ||
            (rc = px_json_bool(m, w, "expert_bias", 0, &o->expert_bias, err)) ||
            (rc = px_json_bool(m, w, "norm_topk", 0, &o->norm_topk, err)) ||
            (rc = px_json_double(m, w, "aux_loss_coeff", 0, 0, 1e3, &o->aux_loss_coeff, err)) ||
            (rc = px_json_double(m, w, "capacity_factor", 0, 0, 1e3, &o->capacity_factor, err)))
            return rc;
        o->score = (ModelRouterScore)score;
    }
    if (a) {
        ModelMla *o = &c->mla;
        snprintf(w, sizeof w, "%s mla", where);
        px_json_warn_unknown(a, w, mla_keys);
        if ((rc = px_json_int(a, w, "q_lora_rank", 0, 0, 1 << 20, &o->q_lora_rank, err)) ||
            (rc = px_json_int(a, w, "kv_lora_rank", 1, 1, 1 << 20, &o->kv_lora_rank, err)) ||
            (rc = px_json_int(a, w, "qk_nope_dim", 1, 1, 1 << 16, &o->qk_nope_dim, err)) ||
            (rc = px_json_int(a, w, "qk_rope_dim", 1, 1, 1 << 16, &o->qk_rope_dim, err)) ||
            (rc = px_json_int(a, w, "v_dim", 1, 1, 1 << 16, &o->v_dim, err)))
            return rc;
    }
    return PX_OK;
}

/* The "rope_scaling" object of the parallax format, in Hugging Face's key names. */
static int parse_native_rope_scaling(const cJSON *j, const char *where, ModelConfig *c,
                                     PxError *err)
{
    static const char *const keys[] = {"rope_type", "factor", "low_freq_factor",
                                       "high_freq_factor", "original_max_position_embeddings",
                                       NULL};
    const cJSON *o = NULL;
    int rc = px_json_object(j, where, "rope_scaling", 0, &o, err);
    if (rc || !o)
        return rc;
    char w[340];
    snprintf(w, sizeof w, "%s rope_scaling", where);
    px_json_warn_unknown(o, w, keys);
    ModelRopeScaling *r = &c->rope_scaling;
    int type = 0;
    if ((rc = px_json_enum(o, w, "rope_type", 1, rope_scaling_names, 2, &type, err)))
        return rc;
    r->type = (ModelRopeScalingType)type;
    if (r->type == MODEL_ROPE_SCALING_NONE)
        return PX_OK;
    return (rc = px_json_double(o, w, "factor", 1, 1.0, 1e6, &r->factor, err)) ||
                   (rc = px_json_double(o, w, "low_freq_factor", 1, 1e-6, 1e6, &r->low_freq_factor,
                                        err)) ||
                   (rc = px_json_double(o, w, "high_freq_factor", 1, 1e-6, 1e6,
                                        &r->high_freq_factor, err)) ||
                   (rc = px_json_int(o, w, "original_max_position_embeddings", 1, 1, 1 << 24,
                                     &r->original_context, err))
               ? rc
               : PX_OK;
}

/* The parallax format (docs/formats.md's Model). */
static int parse_native(const cJSON *j, const char *origin, ModelConfig *c, PxError *err)
{
    static const char *const known[] = {
        "schema_version", "name",     "family",          "layers",   "hidden",     "heads",
        "kv_heads",       "head_dim", "ffn_hidden",      "vocab",    "seq_len",    "norm",
        "mlp",            "position", "tied_embeddings", "bias",     "qkv_bias",   "norm_eps",
        "rope_theta",     "source",   "description",     "moe",      "mla",        "mtp_layers",
        "attn_sinks",     "proj_bias", "qk_norm",         "rope_scaling", "recipe",   NULL};
    char where[300];
    snprintf(where, sizeof where, "%s:", origin);
    int rc, version = 1, fam = 0;
    if ((rc = px_json_int(j, where, "schema_version", 0, 1, 1, &version, err)))
        return rc;
    if (!cJSON_GetObjectItemCaseSensitive(j, "family"))
        return px_fail(err, PX_EINPUT,
                       "%s family: missing required key (a parallax model needs \"family\": "
                       "\"gpt\" or \"llama\"; a Hugging Face config.json has \"model_type\")",
                       where);
    if ((rc = px_json_enum(j, where, "family", 1, family_names, 2, &fam, err)))
        return rc;
    memset(c, 0, sizeof *c);
    c->family = (ModelFamily)fam;
    family_defaults(c);
    px_json_warn_unknown(j, where, known);
    int norm = (int)c->norm, mlp = (int)c->mlp, pos = (int)c->position;
    if ((rc = px_json_string(j, where, "name", 1, c->name, sizeof c->name, err)) ||
        (rc = px_json_int(j, where, "layers", 1, 1, 100000, &c->layers, err)) ||
        (rc = px_json_int(j, where, "hidden", 1, 1, 1 << 20, &c->hidden, err)) ||
        (rc = px_json_int(j, where, "heads", 1, 1, 1 << 16, &c->heads, err)) ||
        (rc = px_json_int(j, where, "vocab", 1, 2, 1 << 28, &c->vocab, err)) ||
        (rc = px_json_int(j, where, "seq_len", 1, 1, 1 << 24, &c->seq_len, err)))
        return rc;
    /* the name heads every table and report: something a person can read on one line */
    int printable = c->name[0] != '\0';
    for (const char *ch = c->name; *ch; ch++)
        printable &= (unsigned char)*ch >= 0x20 && *ch != 0x7f;
    if (!printable)
        return px_fail(err, PX_EINPUT, "%s name: expected a non-empty name without control characters",
                       where);
    c->kv_heads = c->heads;
    c->head_dim = c->hidden % c->heads == 0 ? c->hidden / c->heads : 0;
    if (c->head_dim == 0 && !cJSON_GetObjectItemCaseSensitive(j, "head_dim"))
        return px_fail(err, PX_EINPUT,
                       "%s hidden %d is not divisible by heads %d: give head_dim explicitly",
                       where, c->hidden, c->heads);
    c->ffn_hidden = c->family == MODEL_LLAMA ? llama_default_ffn(c->hidden) : 4 * c->hidden;
    if ((rc = px_json_int(j, where, "kv_heads", 0, 1, 1 << 16, &c->kv_heads, err)) ||
        (rc = px_json_int(j, where, "head_dim", c->head_dim == 0, 1, 1 << 16, &c->head_dim, err)) ||
        (rc = px_json_int(j, where, "ffn_hidden", 0, 1, 1 << 24, &c->ffn_hidden, err)) ||
        (rc = px_json_enum(j, where, "norm", 0, norm_names, 2, &norm, err)) ||
        (rc = px_json_enum(j, where, "mlp", 0, mlp_names, 2, &mlp, err)) ||
        (rc = px_json_enum(j, where, "position", 0, position_names, 2, &pos, err)) ||
        (rc = px_json_bool(j, where, "tied_embeddings", 0, &c->tied_embeddings, err)) ||
        (rc = px_json_bool(j, where, "bias", 0, &c->bias, err)) ||
        (rc = px_json_bool(j, where, "qkv_bias", 0, &c->qkv_bias, err)) ||
        (rc = px_json_bool(j, where, "proj_bias", 0, &c->proj_bias, err)) ||
        (rc = px_json_double(j, where, "norm_eps", 0, 1e-12, 1.0, &c->norm_eps, err)) ||
        (rc = px_json_double(j, where, "rope_theta", 0, 1.0, 1e12, &c->rope_theta, err)))
        return rc;
    c->norm = (ModelNorm)norm;
    c->mlp = (ModelMlp)mlp;
    c->position = (ModelPosition)pos;
    if ((rc = parse_native_moe(j, where, c, err)) ||
        (rc = parse_native_rope_scaling(j, where, c, err)))
        return rc;
    return model_config_check(c, origin, err);
}

/* Hugging Face configs use null for "not set": treat it as absent. */
static const cJSON *hf_item(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* An integer of at least lo (1 for sizes, 0 for counts that may be none). */
static int hf_int_min(const cJSON *j, const char *where, const char *key, int required, int lo,
                      int *out, PxError *err)
{
    if (!hf_item(j, key)) {
        if (!required)
            return PX_OK;
        char path[300];
        px_json_path(path, sizeof path, where, key);
        return px_fail(err, PX_EINPUT, "%s: missing required key", path);
    }
    return px_json_int(j, where, key, 1, lo, 1 << 28, out, err);
}

static int hf_int(const cJSON *j, const char *where, const char *key, int required, int *out,
                  PxError *err)
{
    return hf_int_min(j, where, key, required, 1, out, err);
}

static int hf_bool(const cJSON *j, const char *where, const char *key, int *out, PxError *err)
{
    return hf_item(j, key) ? px_json_bool(j, where, key, 1, out, err) : PX_OK;
}

static void hf_name(const char *origin, const cJSON *j, char *out, size_t cap)
{
    const cJSON *n = hf_item(j, "_name_or_path");
    if (cJSON_IsString(n) && n->valuestring[0]) {
        px_strlcpy(out, px_basename(n->valuestring), cap);
        return;
    }
    /* ".../Llama-3-8B/config.json" names the model by its directory. */
    char buf[512];
    px_strlcpy(buf, origin, sizeof buf);
    char *slash = strrchr(buf, '/');
    if (slash && strcmp(slash + 1, "config.json") == 0) {
        *slash = '\0';
        px_strlcpy(out, px_basename(buf), cap);
        return;
    }
    const char *base = px_basename(origin);
    px_strlcpy(out, base, cap);
    char *dot = strrchr(out, '.');
    if (dot && dot != out)
        *dot = '\0';
}

/* rope_theta at the top level (transformers 4), or inside rope_parameters (transformers 5),
 * which models with per-layer-type rotary settings key by layer type: the full-attention
 * layers' base is the model's. */
static int hf_rope_theta(const cJSON *j, const char *where, double *theta, PxError *err)
{
    const cJSON *rp = hf_item(j, "rope_parameters");
    if (rp) {
        char w[340];
        px_json_path(w, sizeof w, where, "rope_parameters");
        if (!cJSON_IsObject(rp))
            return px_fail(err, PX_EINPUT, "%s: expected an object", w);
        const cJSON *full = hf_item(rp, "full_attention");
        if (!hf_item(rp, "rope_theta") && cJSON_IsObject(full)) {
            char wf[360];
            px_json_path(wf, sizeof wf, w, "full_attention");
            return hf_item(full, "rope_theta")
                       ? px_json_double(full, wf, "rope_theta", 1, 1, 1e12, theta, err)
                       : PX_OK;
        }
        if (hf_item(rp, "rope_theta"))
            return px_json_double(rp, w, "rope_theta", 1, 1, 1e12, theta, err);
    }
    if (hf_item(j, "rope_theta"))
        return px_json_double(j, where, "rope_theta", 1, 1, 1e12, theta, err);
    return PX_OK;
}

/* The rotary scaling of a long-context config: transformers 4's rope_scaling, or transformers 5's
 * rope_parameters (its full_attention entry where keyed by layer type), whose type is rope_type
 * (older configs: type). Llama 3.1's llama3 is carried; any other is warned about and planned as
 * plain RoPE. It also sets the planning sequence (seq_len, the default --seq): the pre-training
 * length, not max_position_embeddings, which for such a config is the context the scaling
 * extends to. That is original_max_position_embeddings (in the scaling object, or at the top
 * level as some configs keep it); else max_position_embeddings / factor for linear scaling
 * (positions divided by the factor: the trained length stretched); else max_position_embeddings
 * (dynamic and YaRN scaling take it as the original length in transformers). A note on stderr
 * says which was taken when it is not max_position_embeddings. */
static int hf_rope_scaling(const cJSON *j, const char *where, ModelConfig *c, PxError *err)
{
    const char *key = "rope_parameters";
    const cJSON *rs = hf_item(j, key);
    if (!rs) {
        key = "rope_scaling";
        rs = hf_item(j, key);
    }
    char w[340];
    px_json_path(w, sizeof w, where, key);
    if (rs && !cJSON_IsObject(rs))
        return px_fail(err, PX_EINPUT, "%s: expected an object", w);
    const cJSON *full = rs ? hf_item(rs, "full_attention") : NULL;
    if (cJSON_IsObject(full)) {
        rs = full;
        px_json_path(w, sizeof w, w, "full_attention");
    }
    const char *tkey = rs && hf_item(rs, "rope_type") ? "rope_type" : "type";
    const cJSON *type = rs ? hf_item(rs, tkey) : NULL;
    if (type && !cJSON_IsString(type)) {
        char wt[360];
        px_json_path(wt, sizeof wt, w, tkey);
        return px_fail(err, PX_EINPUT, "%s: expected a string", wt);
    }
    const char *t = type ? type->valuestring : "default";
    int rc, original = 0;
    double factor = 1.0;
    char from[120] = "original_max_position_embeddings";
    if (rs && (rc = px_json_double(rs, w, "factor", 0, 1e-6, 1e6, &factor, err)))
        return rc;
    if (rs && hf_item(rs, "original_max_position_embeddings")) {
        if ((rc = px_json_int(rs, w, "original_max_position_embeddings", 1, 1, 1 << 24, &original,
                              err)))
            return rc;
        snprintf(from, sizeof from, "%s.%soriginal_max_position_embeddings", key,
                 cJSON_IsObject(full) ? "full_attention." : "");
    } else if (hf_item(j, "original_max_position_embeddings") &&
               (rc = px_json_int(j, where, "original_max_position_embeddings", 1, 1, 1 << 24,
                                 &original, err))) {
        return rc;
    }
    if (strcmp(t, "llama3") == 0) {
        ModelRopeScaling *r = &c->rope_scaling;
        r->type = MODEL_ROPE_SCALING_LLAMA3;
        r->factor = factor;
        if ((rc = px_json_double(rs, w, "factor", 1, 1.0, 1e6, &r->factor, err)) ||
            (rc = px_json_double(rs, w, "low_freq_factor", 1, 1e-6, 1e6, &r->low_freq_factor,
                                 err)) ||
            (rc = px_json_double(rs, w, "high_freq_factor", 1, 1e-6, 1e6, &r->high_freq_factor,
                                 err)))
            return rc;
        if (!original) {
            char wo[360];
            px_json_path(wo, sizeof wo, w, "original_max_position_embeddings");
            return px_fail(err, PX_EINPUT, "%s: missing required key (llama3 scaling)", wo);
        }
        r->original_context = original;
    } else if (strcmp(t, "default") != 0) {
        px_warn("%s %s '%s' (factor %g) is not carried: parallax plans and exports plain RoPE "
                "with base %g",
                w, tkey, t, factor, c->rope_theta);
    }
    const int max_pos = c->seq_len;
    if (!original && strcmp(t, "linear") == 0 && factor > 1) {
        original = (int)(max_pos / factor);
        snprintf(from, sizeof from, "max_position_embeddings / %s.factor", key);
    }
    if (original > 0 && original != max_pos) {
        c->seq_len = original;
        px_info("%s planning sequence %d from %s (the pre-training length), not "
                "max_position_embeddings %d (the context %s rope scaling reaches); --seq sets "
                "another",
                where, original, from, max_pos, t);
    }
    return PX_OK;
}

/* Qwen's mlp_only_layers: dense layers named one by one. A leading run 0 .. k-1 with every
 * other layer MoE is first_dense k; any other set has no parallax spelling. */
static int hf_mlp_only_layers(const cJSON *j, const char *where, ModelMoe *m, PxError *err)
{
    const cJSON *a = hf_item(j, "mlp_only_layers");
    if (!a)
        return PX_OK;
    char path[300];
    px_json_path(path, sizeof path, where, "mlp_only_layers");
    if (!cJSON_IsArray(a))
        return px_fail(err, PX_EINPUT, "%s: expected an array of layer numbers", path);
    int n = 0, prefix = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble != (int)e->valuedouble)
            return px_fail(err, PX_EINPUT, "%s: expected an array of layer numbers", path);
        prefix &= e->valueint == n;
        n++;
    }
    if (n == 0)
        return PX_OK;
    if (prefix && m->layer_freq == 1)
        m->first_dense = n;
    else
        px_warn("%s lists dense layers parallax cannot place (only a leading run with every "
                "later layer MoE): modelled as MoE layers",
                path);
    return PX_OK;
}

/* The experts of a Hugging Face MoE config, each model type with its own spelling:
 *   mixtral:    num_local_experts, num_experts_per_tok, intermediate_size (no dense MLP);
 *   qwen2_moe:  num_experts, moe_intermediate_size, shared_expert_intermediate_size behind a
 *               sigmoid gate, decoder_sparse_step, mlp_only_layers, norm_topk_prob;
 *   qwen3_moe:  the same without shared experts;
 *   deepseek_v3: n_routed_experts, moe_intermediate_size, n_shared_experts of that width,
 *               first_k_dense_replace, moe_layer_freq, scoring_func, n_group, topk_group;
 *   gpt_oss:    num_local_experts, experts_per_token, intermediate_size, biases on the router
 *               and the experts.
 * A dense model type returns with experts 0. ffn_hidden stays the dense MLP's width where the
 * model has dense layers, else becomes the experts'. */
static int parse_hf_moe(const cJSON *j, const char *where, const char *type, ModelConfig *c,
                        PxError *err)
{
    const int mixtral = strcmp(type, "mixtral") == 0, gpt_oss = strcmp(type, "gpt_oss") == 0;
    const int qwen2 = strcmp(type, "qwen2_moe") == 0, qwen3 = strcmp(type, "qwen3_moe") == 0;
    const int deepseek = strcmp(type, "deepseek_v3") == 0;
    if (!mixtral && !gpt_oss && !qwen2 && !qwen3 && !deepseek)
        return PX_OK;
    ModelMoe *m = &c->moe;
    /* transformers 5 writes Qwen3-MoE's num_experts as num_local_experts */
    const char *k_experts = mixtral || gpt_oss ? "num_local_experts"
                            : deepseek         ? "n_routed_experts"
                            : qwen3 && !hf_item(j, "num_experts") && hf_item(j, "num_local_experts")
                                ? "num_local_experts"
                                : "num_experts";
    const char *k_ffn = mixtral || gpt_oss ? "intermediate_size" : "moe_intermediate_size";
    const char *k_topk =
        gpt_oss && hf_item(j, "experts_per_token") ? "experts_per_token" : "num_experts_per_tok";
    int rc;
    if ((rc = hf_int(j, where, k_experts, 1, &m->experts, err)) ||
        (rc = hf_int(j, where, k_topk, 1, &m->topk, err)) ||
        (rc = hf_int(j, where, k_ffn, 1, &m->expert_ffn, err)))
        return rc;
    if (m->topk > m->experts)
        return px_fail(err, PX_EINPUT, "%s %s %d exceeds %s %d", where, k_topk, m->topk, k_experts,
                       m->experts);
    m->layer_freq = 1;
    /* Mixtral and GPT-OSS take the softmax over the chosen experts' logits: weights that sum
     * to 1, as renormalised top-k of a softmax; DeepSeek-V3 renormalises by default;
     * Qwen's norm_topk_prob defaults to false. */
    m->norm_topk = mixtral || gpt_oss || deepseek;
    if ((rc = hf_bool(j, where, "norm_topk_prob", &m->norm_topk, err)))
        return rc;
    const char *k_aux = deepseek ? "aux_loss_alpha" : "router_aux_loss_coef";
    if (hf_item(j, k_aux) &&
        (rc = px_json_double(j, where, k_aux, 1, 0, 1e3, &m->aux_loss_coeff, err)))
        return rc;
    if (gpt_oss)
        m->router_bias = m->expert_bias = 1;
    if (qwen2 || qwen3) {
        if ((rc = hf_int(j, where, "decoder_sparse_step", 0, &m->layer_freq, err)))
            return rc;
        if (qwen2) {
            if ((rc = hf_int_min(j, where, "shared_expert_intermediate_size", 0, 0,
                                 &m->shared_ffn, err)))
                return rc;
            m->shared_gate = m->shared_ffn > 0;
        }
        if ((rc = hf_mlp_only_layers(j, where, m, err)))
            return rc;
    }
    if (deepseek) {
        int shared = 0, freq = 1, groups = 1, topk_groups = 1;
        if ((rc = hf_int_min(j, where, "n_shared_experts", 0, 0, &shared, err)) ||
            (rc = hf_int_min(j, where, "first_k_dense_replace", 0, 0, &m->first_dense, err)) ||
            (rc = hf_int(j, where, "moe_layer_freq", 0, &freq, err)) ||
            (rc = hf_int(j, where, "n_group", 0, &groups, err)) ||
            (rc = hf_int(j, where, "topk_group", 0, &topk_groups, err)))
            return rc;
        m->shared_ffn = shared * m->expert_ffn;
        m->score = MODEL_ROUTER_SIGMOID;
        const cJSON *sf = hf_item(j, "scoring_func");
        if (sf) {
            char path[300];
            px_json_path(path, sizeof path, where, "scoring_func");
            if (cJSON_IsString(sf) && strcmp(sf->valuestring, "softmax") == 0)
                m->score = MODEL_ROUTER_SOFTMAX;
            else if (!cJSON_IsString(sf) || strcmp(sf->valuestring, "sigmoid") != 0)
                return px_fail(err, PX_EINPUT,
                               "%s: '%s' is not supported (softmax, sigmoid)", path,
                               cJSON_IsString(sf) ? sf->valuestring : "not a string");
        }
        if (groups > 1) {
            if (m->experts % groups != 0)
                return px_fail(err, PX_EINPUT, "%s n_group %d must divide n_routed_experts %d",
                               where, groups, m->experts);
            if (topk_groups > groups)
                return px_fail(err, PX_EINPUT, "%s topk_group %d exceeds n_group %d", where,
                               topk_groups, groups);
            m->groups = groups;
            m->topk_groups = topk_groups;
        }
        /* DeepSeek's MoE layers are l >= first_k_dense_replace with l % moe_layer_freq == 0;
         * parallax's every layer_freq-th layer from first_dense on. The first MoE layer l0
         * fixes the latter: first_dense = l0 - freq + 1, when that is not negative. */
        if (freq > 1) {
            const int l0 = (m->first_dense + freq - 1) / freq * freq;
            if (l0 - freq + 1 >= 0)
                m->first_dense = l0 - freq + 1;
            else
                px_warn("%s moe_layer_freq %d with MoE layer 0 cannot be placed: modelled as "
                        "every %d-th layer from layer %d",
                        where, freq, freq, freq - 1);
            m->layer_freq = freq;
        }
    }
    if (model_moe_layers_in(c, 0, c->layers) == c->layers)
        c->ffn_hidden = m->expert_ffn;
    return PX_OK;
}

/* DeepSeek's multi-head latent attention and multi-token prediction. */
static int parse_hf_mla(const cJSON *j, const char *where, ModelConfig *c, PxError *err)
{
    ModelMla *a = &c->mla;
    int rc;
    if ((rc = hf_int_min(j, where, "q_lora_rank", 0, 0, &a->q_lora_rank, err)) ||
        (rc = hf_int(j, where, "kv_lora_rank", 1, &a->kv_lora_rank, err)) ||
        (rc = hf_int(j, where, "qk_nope_head_dim", 1, &a->qk_nope_dim, err)) ||
        (rc = hf_int(j, where, "qk_rope_head_dim", 1, &a->qk_rope_dim, err)) ||
        (rc = hf_int(j, where, "v_head_dim", 1, &a->v_dim, err)) ||
        (rc = hf_int_min(j, where, "num_nextn_predict_layers", 0, 0, &c->mtp_layers, err)))
        return rc;
    /* the query/key head width: what attention's scores contract over */
    c->head_dim = a->qk_nope_dim + a->qk_rope_dim;
    return PX_OK;
}

/* Sliding-window attention is modelled as full causal attention: say where it applies. */
static void hf_warn_sliding(const cJSON *j, const char *where, const ModelConfig *c)
{
    const cJSON *sw = hf_item(j, "sliding_window"), *use = hf_item(j, "use_sliding_window");
    if (!cJSON_IsNumber(sw) || sw->valuedouble >= c->seq_len || cJSON_IsFalse(use))
        return;
    const cJSON *types = hf_item(j, "layer_types"), *t;
    int sliding = 0, n = 0;
    if (cJSON_IsArray(types)) {
        cJSON_ArrayForEach(t, types)
        {
            n++;
            sliding += cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        }
        if (sliding == 0)
            return;
        px_warn("%s sliding_window %.0f on the %d of %d layers layer_types marks "
                "sliding_attention is modelled as full causal attention",
                where, sw->valuedouble, sliding, n);
        return;
    }
    px_warn("%s sliding_window %.0f is modelled as full causal attention", where,
            sw->valuedouble);
}

static const char *const hf_types[] = {"gpt2",      "llama",     "mistral",     "qwen2",
                                       "qwen3",     "mixtral",   "qwen2_moe",   "qwen3_moe",
                                       "deepseek_v3", "gpt_oss", NULL};

static int parse_hf(const cJSON *j, const char *origin, const char *type, ModelConfig *c,
                    PxError *err)
{
    char where[300];
    snprintf(where, sizeof where, "%s:", origin);
    memset(c, 0, sizeof *c);
    hf_name(origin, j, c->name, sizeof c->name);
    int rc, tied;
    if (strcmp(type, "gpt2") == 0) {
        c->family = MODEL_GPT;
        family_defaults(c);
        c->seq_len = 1024;
        if ((rc = hf_int(j, where, "n_layer", 1, &c->layers, err)) ||
            (rc = hf_int(j, where, "n_embd", 1, &c->hidden, err)) ||
            (rc = hf_int(j, where, "n_head", 1, &c->heads, err)) ||
            (rc = hf_int(j, where, "vocab_size", 1, &c->vocab, err)) ||
            (rc = hf_int(j, where, "n_ctx", 0, &c->seq_len, err)) ||
            (rc = hf_int(j, where, "n_positions", 0, &c->seq_len, err)))
            return rc;
        c->ffn_hidden = 4 * c->hidden;
        if ((rc = hf_int(j, where, "n_inner", 0, &c->ffn_hidden, err)))
            return rc;
        if (hf_item(j, "layer_norm_epsilon") &&
            (rc = px_json_double(j, where, "layer_norm_epsilon", 1, 1e-12, 1, &c->norm_eps, err)))
            return rc;
        if (c->hidden % c->heads != 0)
            return px_fail(err, PX_EINPUT, "%s n_embd %d is not divisible by n_head %d", where,
                           c->hidden, c->heads);
        c->kv_heads = c->heads;
        c->head_dim = c->hidden / c->heads;
    } else {
        c->family = MODEL_LLAMA;
        family_defaults(c);
        if ((rc = hf_int(j, where, "num_hidden_layers", 1, &c->layers, err)) ||
            (rc = hf_int(j, where, "hidden_size", 1, &c->hidden, err)) ||
            (rc = hf_int(j, where, "num_attention_heads", 1, &c->heads, err)) ||
            (rc = hf_int(j, where, "intermediate_size", 1, &c->ffn_hidden, err)) ||
            (rc = hf_int(j, where, "vocab_size", 1, &c->vocab, err)) ||
            (rc = hf_int(j, where, "max_position_embeddings", 1, &c->seq_len, err)))
            return rc;
        const int mla = strcmp(type, "deepseek_v3") == 0;
        c->kv_heads = c->heads;
        if (c->hidden % c->heads == 0 || mla)
            c->head_dim = c->hidden / c->heads;
        else if (!hf_item(j, "head_dim"))
            return px_fail(err, PX_EINPUT,
                           "%s hidden_size %d is not divisible by num_attention_heads %d and "
                           "there is no head_dim",
                           where, c->hidden, c->heads);
        if ((rc = hf_int(j, where, "num_key_value_heads", 0, &c->kv_heads, err)) ||
            (!mla && (rc = hf_int(j, where, "head_dim", c->head_dim == 0, &c->head_dim, err))))
            return rc;
        if (hf_item(j, "rms_norm_eps") &&
            (rc = px_json_double(j, where, "rms_norm_eps", 1, 1e-12, 1, &c->norm_eps, err)))
            return rc;
        if ((rc = hf_rope_theta(j, where, &c->rope_theta, err)) ||
            (rc = hf_rope_scaling(j, where, c, err)) ||
            (rc = hf_bool(j, where, "attention_bias", &c->qkv_bias, err)))
            return rc;
        /* Qwen2 and Qwen2-MoE always carry q/k/v biases (and none elsewhere); GPT-OSS's
         * attention_bias covers the output projection too; Qwen3 normalises each query and
         * key head. */
        if (strcmp(type, "qwen2") == 0 || strcmp(type, "qwen2_moe") == 0)
            c->qkv_bias = 1;
        if (strcmp(type, "gpt_oss") == 0) {
            c->proj_bias = c->qkv_bias;
            c->attn_sinks = 1;
        }
        c->qk_norm = strcmp(type, "qwen3") == 0 || strcmp(type, "qwen3_moe") == 0;
        if (mla && (rc = parse_hf_mla(j, where, c, err)))
            return rc;
        if ((rc = parse_hf_moe(j, where, type, c, err)))
            return rc;
        const cJSON *act = hf_item(j, "hidden_act");
        if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
            px_warn("%s hidden_act '%s' modelled as SwiGLU (silu)", where, act->valuestring);
        hf_warn_sliding(j, where, c);
    }
    tied = c->tied_embeddings;
    if (hf_item(j, "tie_word_embeddings") &&
        (rc = px_json_bool(j, where, "tie_word_embeddings", 1, &tied, err)))
        return rc;
    c->tied_embeddings = tied;
    return model_config_check(c, origin, err);
}

int model_config_from_json(const cJSON *j, const char *origin, ModelConfig *out, PxError *err)
{
    if (!cJSON_IsObject(j))
        return px_fail(err, PX_EINPUT, "%s: expected a JSON object", origin);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (type) {
        if (!cJSON_IsString(type))
            return px_fail(err, PX_EINPUT, "%s: model_type: expected a string", origin);
        const char *t = type->valuestring;
        char list[200] = "";
        size_t n = 0;
        for (int i = 0; hf_types[i]; i++) {
            if (strcmp(t, hf_types[i]) == 0)
                return parse_hf(j, origin, t, out, err);
            if (n < sizeof list)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                      hf_types[i]);
        }
        return px_fail(err, PX_EINPUT, "%s: model_type '%s' is not supported (%s)", origin, t,
                       list);
    }
    return parse_native(j, origin, out, err);
}

int model_config_load(const char *name_or_path, ModelConfig *out, PxError *err)
{
    for (int i = 0; i < model_zoo_data_count; i++) {
        if (strcmp(model_zoo_data[i].name, name_or_path) == 0) {
            char origin[128];
            snprintf(origin, sizeof origin, "zoo model %s", name_or_path);
            cJSON *j = px_json_parse(model_zoo_data[i].text, origin, err);
            if (!j)
                return PX_ERUNTIME;
            int rc = model_config_from_json(j, origin, out, err);
            cJSON_Delete(j);
            return rc;
        }
    }
    if (!px_path_exists(name_or_path))
        return px_fail(err, PX_EINPUT,
                       "unknown model '%s': not in the zoo ('parallax models' lists it) and no "
                       "such file",
                       name_or_path);
    cJSON *j = px_json_read_file(name_or_path, err);
    if (!j)
        return PX_EINPUT;
    int rc = model_config_from_json(j, name_or_path, out, err);
    cJSON_Delete(j);
    return rc;
}

cJSON *model_config_to_json(const ModelConfig *c)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "schema_version", 1);
    cJSON_AddStringToObject(j, "name", c->name);
    cJSON_AddStringToObject(j, "family", family_names[c->family]);
    cJSON_AddNumberToObject(j, "layers", c->layers);
    cJSON_AddNumberToObject(j, "hidden", c->hidden);
    cJSON_AddNumberToObject(j, "heads", c->heads);
    cJSON_AddNumberToObject(j, "kv_heads", c->kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "ffn_hidden", c->ffn_hidden);
    cJSON_AddNumberToObject(j, "vocab", c->vocab);
    cJSON_AddNumberToObject(j, "seq_len", c->seq_len);
    cJSON_AddStringToObject(j, "norm", norm_names[c->norm]);
    cJSON_AddStringToObject(j, "mlp", mlp_names[c->mlp]);
    cJSON_AddStringToObject(j, "position", position_names[c->position]);
    cJSON_AddBoolToObject(j, "tied_embeddings", c->tied_embeddings);
    cJSON_AddBoolToObject(j, "bias", c->bias);
    cJSON_AddBoolToObject(j, "qkv_bias", c->qkv_bias);
    cJSON_AddNumberToObject(j, "norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    const ModelMoe *m = &c->moe;
    if (m->experts > 0) {
        cJSON *o = cJSON_AddObjectToObject(j, "moe");
        cJSON_AddNumberToObject(o, "experts", m->experts);
        cJSON_AddNumberToObject(o, "topk", m->topk);
        cJSON_AddNumberToObject(o, "expert_ffn", m->expert_ffn);
        cJSON_AddNumberToObject(o, "shared_ffn", m->shared_ffn);
        cJSON_AddBoolToObject(o, "shared_gate", m->shared_gate);
        cJSON_AddNumberToObject(o, "first_dense", m->first_dense);
        cJSON_AddNumberToObject(o, "layer_freq", m->layer_freq);
        cJSON_AddStringToObject(o, "score", score_names[m->score]);
        cJSON_AddNumberToObject(o, "groups", m->groups);
        cJSON_AddNumberToObject(o, "topk_groups", m->topk_groups);
        cJSON_AddBoolToObject(o, "router_bias", m->router_bias);
        cJSON_AddBoolToObject(o, "expert_bias", m->expert_bias);
        cJSON_AddBoolToObject(o, "norm_topk", m->norm_topk);
        cJSON_AddNumberToObject(o, "aux_loss_coeff", m->aux_loss_coeff);
        cJSON_AddNumberToObject(o, "capacity_factor", m->capacity_factor);
    }
    const ModelMla *a = &c->mla;
    if (a->kv_lora_rank > 0) {
        cJSON *o = cJSON_AddObjectToObject(j, "mla");
        cJSON_AddNumberToObject(o, "q_lora_rank", a->q_lora_rank);
        cJSON_AddNumberToObject(o, "kv_lora_rank", a->kv_lora_rank);
        cJSON_AddNumberToObject(o, "qk_nope_dim", a->qk_nope_dim);
        cJSON_AddNumberToObject(o, "qk_rope_dim", a->qk_rope_dim);
        cJSON_AddNumberToObject(o, "v_dim", a->v_dim);
    }
    if (c->mtp_layers > 0)
        cJSON_AddNumberToObject(j, "mtp_layers", c->mtp_layers);
    if (c->attn_sinks)
        cJSON_AddBoolToObject(j, "attn_sinks", c->attn_sinks);
    if (c->proj_bias)
        cJSON_AddBoolToObject(j, "proj_bias", c->proj_bias);
    if (c->qk_norm)
        cJSON_AddBoolToObject(j, "qk_norm", c->qk_norm);
    const ModelRopeScaling *r = &c->rope_scaling;
    if (r->type != MODEL_ROPE_SCALING_NONE) {
        cJSON *o = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(o, "rope_type", model_rope_scaling_name(r->type));
        cJSON_AddNumberToObject(o, "factor", r->factor);
        cJSON_AddNumberToObject(o, "low_freq_factor", r->low_freq_factor);
        cJSON_AddNumberToObject(o, "high_freq_factor", r->high_freq_factor);
        cJSON_AddNumberToObject(o, "original_max_position_embeddings", r->original_context);
    }
    return j;
}

int model_layer_is_moe(const ModelConfig *c, int l)
{
    const ModelMoe *m = &c->moe;
    if (m->experts <= 0)
        return 0;
    if (l >= c->layers) /* a prediction module's layer is like the last layer (Megatron) */
        l = c->layers - 1;
    const int freq = m->layer_freq > 0 ? m->layer_freq : 1;
    return l >= m->first_dense && (l - m->first_dense + 1) % freq == 0;
}

int model_moe_layers_in(const ModelConfig *c, int first, int n)
{
    int k = 0;
    for (int l = first; l < first + n; l++)
        k += model_layer_is_moe(c, l);
    return k;
}

/* Parameters of one transformer layer, tensor by tensor as the tensor table holds them; with
 * active set, what one token passes through: topk of the routed experts instead of all.
 *   attention: qkv [(q + 2kv) x h], or MLA's q_a [q_lora x h], q_norm [q_lora],
 *              q_b [heads (nope + rope) x q_lora] (q [heads (nope + rope) x h] without q_lora),
 *              kv_a [(kv_lora + rope) x h], kv_norm [kv_lora], kv_b [heads (nope + v) x kv_lora];
 *              proj [h x heads v_hd]; biases, sinks [heads], q/k norms [2 head_dim];
 *   two norms [h] ([2h]: LayerNorm with bias);
 *   dense MLP: fc1 [fc1_out x h], fc2 [h x ffn] (fc1_out 2 ffn for SwiGLU), biases;
 *   MoE: router [E x h] (+ [E]), each routed expert fc1 [2 eff x h] + fc2 [h x eff]
 *        (+ [2 eff] + [h]), shared experts fc1 [2 sff x h] + fc2 [h x sff], their gate [h]. */
static double layer_params(const ModelConfig *c, int moe, int active)
{
    const double h = c->hidden, heads = c->heads;
    const int bias = c->bias;
    const ModelMla *a = &c->mla;
    double p = 2 * (c->norm == MODEL_LAYERNORM && bias ? 2 * h : h), o_in;
    if (a->kv_lora_rank > 0) {
        const double qk = heads * (a->qk_nope_dim + a->qk_rope_dim), lq = a->q_lora_rank,
                     lkv = a->kv_lora_rank;
        p += lq > 0 ? lq * h + lq + qk * lq : qk * h;
        p += (lkv + a->qk_rope_dim) * h + lkv + heads * (a->qk_nope_dim + a->v_dim) * lkv;
        o_in = heads * a->v_dim;
    } else {
        const double q = heads * c->head_dim, kv = (double)c->kv_heads * c->head_dim;
        p += (q + 2 * kv) * h + (bias || c->qkv_bias ? q + 2 * kv : 0);
        o_in = q;
    }
    p += h * o_in + (bias || c->proj_bias ? h : 0);
    if (c->attn_sinks)
        p += heads;
    if (c->qk_norm)
        p += 2.0 * c->head_dim;
    const int swiglu = c->mlp == MODEL_SWIGLU;
    if (!moe) {
        const double f = c->ffn_hidden, f1 = swiglu ? 2 * f : f;
        return p + f1 * h + h * f + (bias ? f1 + h : 0);
    }
    const ModelMoe *m = &c->moe;
    const double e = m->experts, eff = m->expert_ffn, e1 = swiglu ? 2 * eff : eff;
    const double sff = m->shared_ffn, s1 = swiglu ? 2 * sff : sff;
    p += e * h + (m->router_bias ? e : 0);
    p += (active ? m->topk : e) * (e1 * h + h * eff + (m->expert_bias ? e1 + h : 0));
    p += s1 * h + h * sff + (m->shared_gate ? h : 0);
    return p;
}

/* The whole model: layers, embedding (and position table), final norm, output layer unless
 * tied, and each MTP module (DeepSeek-V3 sec. 2.2): norms of the hidden state and of the next
 * token's embedding, the projection of their concatenation [h x 2h], one layer like the last
 * and its own final norm; the embedding and output layer are the main model's. */
static double model_params(const ModelConfig *c, int active)
{
    const double h = c->hidden;
    const double norm = c->norm == MODEL_LAYERNORM && c->bias ? 2 * h : h;
    const int moe = model_moe_layers_in(c, 0, c->layers);
    double total = moe * layer_params(c, 1, active) + (c->layers - moe) * layer_params(c, 0, active);
    total += (double)c->vocab * h + norm;
    if (c->position == MODEL_POS_LEARNED)
        total += (double)c->seq_len * h;
    if (!c->tied_embeddings)
        total += (double)c->vocab * h;
    for (int i = 0; i < c->mtp_layers; i++)
        total += 3 * norm + 2 * h * h + layer_params(c, model_layer_is_moe(c, c->layers + i), active);
    return total;
}

double model_config_params(const ModelConfig *c) { return model_params(c, 0); }

double model_config_active_params(const ModelConfig *c) { return model_params(c, 1); }
