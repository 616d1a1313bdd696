/* http_route.c — the exporter's handling of request targets, apart from
 * libmicrohttpd so that tests and the fuzzer (tests/fuzz/fuzz_http.c) reach
 * it: percent-decoding that refuses to decode an escaped NUL (a NUL would
 * cut "/metrics%00" to "/metrics"), and the map from method and path to a
 * page. Only exact paths match. */
#include "monitor/monitor.h"

#include <string.h>

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

size_t gm__http_unescape(char *s) {
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++; /* a bad escape, or %00, stays as written */
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

int gm__http_route(const char *method, const char *path) {
    if (!method || !path) return GM_HTTP_NOT_FOUND;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) return GM_HTTP_BAD_METHOD;
    if (!strcmp(path, "/")) return GM_HTTP_INDEX;
    if (!strcmp(path, "/metrics")) return GM_HTTP_METRICS;
    return GM_HTTP_NOT_FOUND;
}
