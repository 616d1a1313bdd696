/* putbuf.c — formatted text into a caller's fixed buffer, for the functions
 * that hand text back that way (gm_config_format, gm_stats_to_json,
 * gm_memory_summary). Writing goes on past the end, counting only, so the
 * error can say how large the buffer has to be. */
#include "frontend.h"

#include <stdarg.h>
#include <stdio.h>

void gm__put(gm__putbuf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->pos < o->len ? o->len - o->pos : 0;
    int n = vsnprintf(room ? o->buf + o->pos : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= room) o->overflow = true;
    if (n > 0) o->pos += (size_t)n;
}

int gm__put_finish(gm__putbuf *o, const char *what) {
    if (!o->overflow) return GM_OK;
    if (o->len) o->buf[o->len - 1] = '\0';
    return gm__set_error(GM_ENOSPACE, "%s: buffer of %zu bytes too small (%zu needed)", what, o->len, o->pos + 1);
}

/* The one byte formatter of the library and the CLI: "512 B", "13.24 GiB"
 * (binary units, two decimals), negatives with a sign. */
const char *gm__format_bytes(int64_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    uint64_t mag = bytes < 0 ? (uint64_t)0 - (uint64_t)bytes : (uint64_t)bytes;
    double v = (double)mag;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%s%llu B", bytes < 0 ? "-" : "", (unsigned long long)mag);
    else snprintf(buf, len, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
    return buf;
}
