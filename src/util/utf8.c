/* utf8.c — UTF-8 for every text gpumem passes on from outside (util.h):
 * names and paths from trace files, label values from the environment and
 * from other processes' published headers. JSON (RFC 8259) and Prometheus's
 * text format both require valid UTF-8: one invalid byte in a label value
 * makes `promtool check metrics` reject the whole scrape, and a value cut at
 * a fixed field's size in the middle of a character is invalid too. So
 * fields are cut on character boundaries when they are filled, and every writer
 * replaces what is still invalid with U+FFFD. */
#include "util/util.h"

int gm__utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi) return 0; /* a NUL is never a continuation byte: stops at the end */
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

void gm__utf8_copy(char *dst, size_t cap, const char *src) {
    if (!cap) return;
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)(src ? src : ""); *p;) {
        int n = gm__utf8_len(p);
        const char *piece = n ? (const char *)p : GM__UTF8_REPLACEMENT;
        size_t len = n ? (size_t)n : sizeof GM__UTF8_REPLACEMENT - 1;
        if (o + len >= cap) break; /* the next character does not fit whole */
        memcpy(dst + o, piece, len);
        o += len;
        p += n ? n : 1;
    }
    dst[o] = '\0';
}
