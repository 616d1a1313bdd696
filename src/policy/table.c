/* table.c — the policy table: every allocator policy by name, with its
 * operations, a line of description and the settings `gpumem tune` tries for
 * it. It sits on the policy floor and hands the table to the core's registry
 * (src/core/policy.c) when the library loads, as the layers above lend the
 * core their hooks: the core never names a policy. The config parser
 * (policy:NAME), the allocator (which ops a device uses), replay, tune and
 * `gpumem config --list` all read the registry, so a new policy is one entry
 * here (tests add one at run time with gm__policy_register). Index =
 * gm_policy_kind. */
#include "policy/gpumem/gpumem.h"
#include "policy/torch/torch.h"

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

/* The default (the reserve budget), two that trade device calls for memory, and the one
 * that trades memory for device calls where shapes change every step (docs/allocator.md). */
static const char *const gpumem_tune[] = {"", "gpumem_slack:0.02", "gpumem_slack:0",
                                          "gpumem_slack:inf,gpumem_chunks:run", NULL};

/* Non-static: a static link of libgpumem.a keeps this object because the
 * build asks for this symbol (-u gm__policy_table, CMakeLists.txt). */
const gm__policy_desc gm__policy_table[GM__POLICY_BUILTIN] = {
    [GM_POLICY_TORCH] = {"torch", &gm__policy_torch,
                         "a faithful model of PyTorch's CUDACachingAllocator (every torch setting)",
                         torch_tune},
    [GM_POLICY_GPUMEM] = {"gpumem", &gm__policy_gpumem,
                          "best fit in per-stream virtual arenas over 2 MiB physical chunks; "
                          "held within 1.5% of the peak allocated, idle memory moved past that",
                          gpumem_tune},
};

/* Before any other constructor of the library (gpumem_torch.c reads the
 * settings at load time, policy:NAME included). */
__attribute__((constructor(101))) static void lend_table(void) { gm__policy_lend(gm__policy_table); }
