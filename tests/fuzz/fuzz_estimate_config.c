/* fuzz_estimate_config.c — libFuzzer target: the estimator's Hugging Face
 * config.json reader (gm_est_model_from_hf_config) on arbitrary bytes must
 * accept or refuse with a status, never crash; an accepted model must pass
 * or fail gm_est_check and, when it passes at a tiny batch, scan without
 * crashing (sizes it accepts must not overflow the model's arithmetic). */
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
    if (gm_est_model_from_hf_config(s, "fuzz", &m) == GM_OK) {
        gm_est_run r;
        gm_est_run_init(&r);
        r.batch = 1;
        r.seq = 8;
        r.image = 32;
        r.steps = 2;
        gm_est_result res;
        if (gm_est_check(&m, &r) == GM_OK) (void)gm_est_scan(&m, &r, &res);
    }
    free(s);
    return 0;
}
