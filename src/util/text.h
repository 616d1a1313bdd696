/* text.h — the text helpers every layer shares (text.c): the one JSON
 * string writer and the one byte formatter. Includes nothing of the library. */
#ifndef GPUMEM_UTIL_TEXT_H
#define GPUMEM_UTIL_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A JSON string of s: invalid UTF-8 as \ufffd, controls as \u00XX;
 * script_safe also escapes <, > and & for HTML <script> data. */
void gm__json_string(FILE *f, const char *s, bool script_safe);
/* "512 B", "13.24 GiB" (binary units, two decimals), negatives with a sign;
 * returns buf. */
const char *gm__format_bytes(int64_t bytes, char *buf, size_t len);

#endif /* GPUMEM_UTIL_TEXT_H */
