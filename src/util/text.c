/* text.c — the text helpers every layer shares (declared in text.h).
 *
 * gm__json_string: one JSON string writer for every JSON gpumem prints
 * (replay/tune --json, report --json/--perfetto, the data in the HTML
 * report). Names and paths come from files and may hold any byte:
 * valid UTF-8 passes through, every byte of an invalid sequence becomes
 * \ufffd (U+FFFD, the replacement character), control bytes \u00XX, so
 * the output is always valid JSON (RFC 8259) whatever the input. */
#include "text.h"

#include "util.h"

#include <stdio.h>

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
            int n = gm__utf8_len(p); /* stops at NUL: a NUL is never a continuation byte */
            if (n) fwrite(p, 1, (size_t)n, f);
            else fputs("\\ufffd", f);
            p += n ? n : 1;
        }
    }
    fputc('"', f);
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
