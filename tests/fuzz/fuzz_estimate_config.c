/* fuzz_estimate_config.c — libFuzzer target: the estimator's Hugging Face
 * config.json reader (gm__est_model_from_hf_config) on arbitrary bytes must
 * accept or refuse with a status, never crash; an accepted model must pass
 * or fail gm__est_check and, when it passes at a tiny batch, scan without
 * crashing (sizes it accepts must not overflow the model's arithmetic) to a
 * positive peak. */
#include "estimate/estimate.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 16384) return 0;
    char *s = fuzz_cstr(data, size);
    if (!s) return 0;
    gm_est_model m;
    if (gm__est_model_from_hf_config(s, "fuzz", &m) == GM_OK) {
        gm_est_run r;
        gm__est_run_init(&r);
        r.batch = 1;
        if (gm__est_is_vision(&m)) r.image = m.family == GM_EST_RESNET ? 32 : m.image;
        else r.seq = 8;
        r.steps = 2;
        gm_est_result res;
        /* a model it can scan has a positive peak: "0 B fits" was issue #26's
         * symptom of a wrapped size; work is bounded by its structure */
        if (gm__est_check(&m, &r) == GM_OK && gm__est_scan(&m, &r, &res) == GM_OK && res.peak <= 0) abort();
    }
    free(s);
    return 0;
}
