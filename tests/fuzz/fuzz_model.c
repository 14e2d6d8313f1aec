/* libFuzzer target: model configurations (parallax JSON and Hugging Face config.json), then the
 * layout rules and the tensor table of a small layout. Any input must give a model or a
 * message, never a crash, a leak or undefined behaviour. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    PxError err = {0};
    cJSON *j = px_json_parse(text, "fuzz", &err);
    free(text);
    if (!j)
        return 0;
    ModelSpec s;
    model_spec_defaults(&s);
    if (model_config_from_json(j, "fuzz", &s.model, &err) == PX_OK) {
        (void)model_config_params(&s.model);
        cJSON_Delete(model_config_to_json(&s.model));
        /* keep the work bounded: only models a test machine could hold a table of */
        if (s.model.layers <= 64 && s.model.hidden <= 4096 && s.model.seq_len <= 4096 &&
            s.model.vocab <= 1 << 18) {
            s.layout.tp = s.model.heads % 2 == 0 && s.model.kv_heads % 2 == 0 ? 2 : 1;
            s.layout.pp = s.model.layers % 2 == 0 ? 2 : 1;
            ModelDims d;
            if (model_spec_check(&s, 0, &d, &err) == PX_OK) {
                ModelTensorTable tt;
                if (model_tensors_build(&s, &d, 0, &tt, &err) == PX_OK)
                    (void)model_tensors_bytes(&tt, MODEL_ACTIVATIONS);
                model_tensors_free(&tt);
            }
        }
    }
    cJSON_Delete(j);
    return 0;
}
