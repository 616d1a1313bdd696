/* policy.c — the policy table: every allocator policy by name, with its
 * operations, a line of description and the settings `gpumem tune` tries for
 * it. The config parser (policy:NAME), the allocator (which ops a device
 * uses), replay, tune and `gpumem config --list` all read this table, so a
 * new policy is one entry here (tests add one at run time with
 * gm__policy_register). Index = gm_policy_kind. */
#include "frontend.h"
#include "policy/gpumem/gpumem.h"
#include "policy/torch/torch.h"

#include <stdio.h>
#include <string.h>

/* What torch users are told to try. {fit} is a memory fraction sized to the
 * trace (1.25x its peak requested at the capacity): the GC threshold only
 * acts under a fraction. */
static const char *const torch_tune[] = {
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:{fit}",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:{fit}",
    "garbage_collection_threshold:0.6,max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "roundup_power2_divisions:16",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "expandable_segments:True,roundup_power2_divisions:4",
    NULL,
};

/* The default (slack inf) and the two that trade device calls for memory. */
static const char *const gpumem_tune[] = {"", "gpumem_slack:0.02", "gpumem_slack:0", NULL};

#define MAX_POLICIES 8

static gm__policy_desc table[MAX_POLICIES] = {
    [GM_POLICY_TORCH] = {"torch", &gm__policy_torch,
                         "a faithful model of PyTorch's CUDACachingAllocator (every torch setting)",
                         torch_tune},
    [GM_POLICY_GPUMEM] = {"gpumem", &gm__policy_gpumem,
                          "best fit in per-stream virtual arenas over 2 MiB physical chunks; "
                          "no device calls once warm",
                          gpumem_tune},
};
static int count = 2;

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
