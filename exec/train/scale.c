/* Dynamic loss scaling for fp16, as PyTorch's torch.amp.GradScaler does it (init_scale 2^16,
 * growth_factor 2, backoff_factor 0.5, growth_interval 2000): fp16's 5-bit exponent cannot hold
 * the small gradients of a large model (below 2^-24 they flush to zero), so the loss is
 * multiplied by a large scale before the backward and the gradients divided by it before the
 * update. A scale too large overflows instead: then the step is skipped (no update, no
 * optimizer step count) and the scale halved; after `interval` clean steps in a row it is
 * doubled again, so the scale stays near the largest that does not overflow. bf16 has fp32's
 * exponent and needs none of this (Micikevicius et al. 2018, "Mixed Precision Training"). */
#include "exec/train/internal.h"

void exec_scaler_init(ExecScaler *s, int enabled, double initial, int interval)
{
    s->enabled = enabled;
    s->scale = enabled ? (initial > 0 ? initial : 65536.0) : 1.0;
    s->interval = interval > 0 ? interval : 2000;
    s->clean = 0;
    s->skipped = 0;
}

int exec_scaler_update(ExecScaler *s, int found_inf)
{
    if (!s->enabled)
        return 0;
    if (found_inf) {
        s->scale *= 0.5;
        s->clean = 0;
        s->skipped++;
        return 1;
    }
    if (++s->clean == s->interval) {
        s->scale *= 2.0;
        s->clean = 0;
    }
    return 0;
}
