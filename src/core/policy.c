/* policy.c — the policy registry: the policies by name (gm_policy_kind is
 * the index), their ops, descriptions and tune settings, as the policy floor
 * lends them (src/policy/table.c, the policy table) and tests add them
 * (gm__policy_register). The config parser (policy:NAME), the allocator
 * (which ops a device uses), replay, tune and `gpumem config --list` all read
 * it. The core names no policy: it holds what it was lent, like a hook. */
#include "frontend.h"

#include <stdio.h>
#include <string.h>

#define MAX_POLICIES 8

/* Empty until the policy floor lends its table (gm__policy_lend). */
static gm__policy_desc table[MAX_POLICIES];
static int count;

void gm__policy_lend(const gm__policy_desc builtin[GM__POLICY_BUILTIN]) {
    for (int i = 0; i < GM__POLICY_BUILTIN; i++) table[i] = builtin[i];
    if (count < GM__POLICY_BUILTIN) count = GM__POLICY_BUILTIN;
}

int gm__policy_register(const gm__policy_desc *p) {
    if (!p || !p->name || !p->ops || count >= MAX_POLICIES || gm_policy_find(p->name) >= 0)
        return gm__set_error(GM_EINVAL, "gm__policy_register: bad, duplicate or one policy too many");
    table[count] = *p; /* registered before any allocator exists (tests) */
    return count++;
}

void gm__policy_unregister_last(void) {
    if (count > GM_POLICY_GPUMEM + 1) memset(&table[--count], 0, sizeof table[0]);
}

const gm__policy_ops *gm__policy_get(int kind) {
    return kind >= 0 && kind < count ? table[kind].ops : NULL;
}

void gm__policy_names(char *buf, size_t len) {
    gm__putbuf o = {buf, len, 0, false};
    if (len) buf[0] = '\0';
    if (!count) gm__put(&o, "a policy, but %s", GM__POLICY_NONE);
    for (int i = 0; i < count; i++)
        gm__put(&o, "%s%s", i == 0 ? "" : i == count - 1 ? " or " : ", ", table[i].name);
    (void)gm__put_finish(&o, "policy names");
}

int gm_policy_count(void) { return count; }

int gm_policy_find(const char *name) {
    for (int i = 0; name && i < count; i++)
        if (!strcmp(table[i].name, name)) return i;
    return -1;
}

const char *gm_policy_name(int kind) { return kind >= 0 && kind < count ? table[kind].name : NULL; }

int gm_policy_info(int kind, gm_policy_desc *out) {
    if (kind < 0 || kind >= count || !out) return gm__set_error(GM_EINVAL, "gm_policy_info: no policy %d", kind);
    *out = (gm_policy_desc){table[kind].name, table[kind].doc, table[kind].tune};
    return GM_OK;
}
