/* json_escape.c — gm__json_string: one JSON string writer for every JSON
 * gpumem prints (replay/tune --json, report --json/--perfetto, the data in
 * the HTML report). Names and paths come from files and may hold any byte:
 * valid UTF-8 passes through, every byte of an invalid sequence becomes
 * \ufffd (U+FFFD, the replacement character), control bytes \u00XX, so
 * the output is always valid JSON (RFC 8259) whatever the input. */
#include "internal.h"

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
