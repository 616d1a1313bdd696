/* util.c — status names and messages, the library version, and the
 * per-thread error detail behind gm_last_error_detail(). */
#include "gpumem/gpumem.h"
#include "util/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *gm_version(void) { return GM_VERSION_STRING; }

const char *gm_strerror(int status) {
    switch (status) {
#define GM__STATUS_MSG(name, value, msg) \
    case value: return msg;
        GM_STATUS_LIST(GM__STATUS_MSG)
#undef GM__STATUS_MSG
    }
    return "unknown status";
}

const char *gm_status_name(int status) {
    switch (status) {
#define GM__STATUS_NAME(name, value, msg) \
    case value: return #name;
        GM_STATUS_LIST(GM__STATUS_NAME)
#undef GM__STATUS_NAME
    }
    return "GM_UNKNOWN";
}

static _Thread_local char error_detail[GM__ERROR_DETAIL_MAX];

const char *gm_last_error_detail(void) { return error_detail; }

/* threads whose error_detail is not empty (util.h, gm__clear_error) */
int gm__errors_out;

void gm__clear_error_now(void) {
    if (!error_detail[0]) return;
    error_detail[0] = '\0';
    __atomic_fetch_sub(&gm__errors_out, 1, __ATOMIC_RELAXED);
}

int gm__set_error(int status, const char *fmt, ...) {
    /* formatted apart first: an argument may point into error_detail */
    char msg[sizeof error_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bool was_empty = !error_detail[0];
    memcpy(error_detail, msg, strlen(msg) + 1);
    if (was_empty != !error_detail[0]) __atomic_fetch_add(&gm__errors_out, was_empty ? 1 : -1, __ATOMIC_RELAXED);
    return status;
}

int gm__check_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return GM_ESTATE;
}
