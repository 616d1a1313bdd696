/* util.h — the ground under every layer (src/util/, docs/architecture.md):
 * byte units, the per-thread error detail (util.c) and array growth.
 * Includes nothing of the library. */
#ifndef GPUMEM_UTIL_UTIL_H
#define GPUMEM_UTIL_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GM__KIB ((uint64_t)1024)
#define GM__MIB (GM__KIB * 1024)
#define GM__GIB (GM__MIB * 1024)

/* The calling thread's gm_last_error_detail() text holds this many bytes
 * with its NUL (the libgpumem_torch messages, which quote a core detail
 * after their own words, fit too). */
#define GM__ERROR_DETAIL_MAX 2048
/* Set the calling thread's gm_last_error_detail() text; returns status. An
 * argument may be the current detail itself. */
int gm__set_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Resize the array *arrp (any T **: the pointer is copied, not read through
 * void **) to n elements of elem bytes. false, and nothing changed, when
 * realloc fails. */
static inline bool gm__realloc_array(void *arrp, size_t n, size_t elem) {
    void *v;
    memcpy(&v, arrp, sizeof v);
    void *nv = realloc(v, n * elem);
    if (!nv) return false;
    memcpy(arrp, &nv, sizeof nv);
    return true;
}
/* Empty the calling thread's detail. Every API call starts with this, so
 * the common case touches no thread-local storage: in a shared library
 * (libgpumem.so; libgpumem_torch.so, which torch dlopens) that goes through
 * __tls_get_addr, a call per operation, and the initial-exec model, which
 * avoids it, made torch's dlopen fail ("cannot allocate memory in static
 * TLS block") once CUDA's libraries had taken the static TLS. Instead a
 * global counts the threads whose detail is not empty: only while some
 * thread has one does a call look at its own. A thread sees its own
 * increments, so it never skips a detail it left. A thread that exits
 * holding a detail keeps the count up: every call then looks, which is
 * what every call did before, never wrong. */
extern int gm__errors_out;
void gm__clear_error_now(void);
static inline void gm__clear_error(void) {
    if (__builtin_expect(__atomic_load_n(&gm__errors_out, __ATOMIC_RELAXED) != 0, 0)) gm__clear_error_now();
}
/* For `check` ops: write the broken invariant into err; returns GM_ESTATE. */
int gm__check_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* UTF-8 (utf8.c). The length of the valid sequence at s (1..4), or 0 if
 * there is none (overlongs, surrogates and code points above U+10FFFF are
 * not; a NUL ends any sequence). */
int gm__utf8_len(const unsigned char *s);
/* U+FFFD, what an invalid byte becomes */
#define GM__UTF8_REPLACEMENT "\xEF\xBF\xBD"
/* src into dst (cap bytes with the NUL) as valid UTF-8: each invalid byte
 * becomes U+FFFD, and it is cut before the first character that does not
 * fit whole (never in the middle of one). */
void gm__utf8_copy(char *dst, size_t cap, const char *src);

#endif /* GPUMEM_UTIL_UTIL_H */
