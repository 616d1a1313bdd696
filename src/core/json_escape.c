/* json_escape.c — gm__json_string: one JSON string writer for every JSON
 * gpumem prints (replay/tune --json, report --json/--perfetto, the data in
 * the HTML report). Names and paths come from files and may hold any byte:
 * valid UTF-8 passes through, every byte of an invalid sequence becomes
 * \ufffd (U+FFFD, the replacement character), control bytes \u00XX, so
 * the output is always valid JSON (RFC 8259) whatever the input. */
#include "internal.h"

#include <stdio.h>

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one
 * (overlongs, surrogates and code points above U+10FFFF are not). */
static int utf8_len(const unsigned char *s) {
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
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

void gm__json_string(FILE *f, const char *str, bool script_safe) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(str ? str : ""); *p;) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            p++;
        } else if (c < 0x20 || c == 0x7F || (script_safe && (c == '<' || c == '>' || c == '&'))) {
            fprintf(f, "\\u%04x", c); /* controls; <, >, & too inside <script> */
            p++;
        } else {
            int n = utf8_len(p); /* stops at NUL: a NUL is never a continuation byte */
            if (n) fwrite(p, 1, (size_t)n, f);
            else fputs("\\ufffd", f);
            p += n ? n : 1;
        }
    }
    fputc('"', f);
}
