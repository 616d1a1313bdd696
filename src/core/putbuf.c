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
