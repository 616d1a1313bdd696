/* action.h — what happened to memory, as torch's TraceEntry names it: the
 * core's allocation history records these (history.h), and the trace layer
 * reads and writes them (src/trace/trace.h, gm__trace_action_name). Here, at
 * the core, so the history needs nothing above it. */
#ifndef GPUMEM_CORE_ACTION_H
#define GPUMEM_CORE_ACTION_H

/* Actions of torch's TraceEntry, in its order. */
#define GM_TRACE_ACTIONS(X)                                                    \
    X(ALLOC, "alloc") X(FREE_REQUESTED, "free_requested")                      \
    X(FREE_COMPLETED, "free_completed") X(SEGMENT_ALLOC, "segment_alloc")      \
    X(SEGMENT_FREE, "segment_free") X(SEGMENT_MAP, "segment_map")              \
    X(SEGMENT_UNMAP, "segment_unmap") X(SNAPSHOT, "snapshot") X(OOM, "oom")

typedef enum gm_trace_action {
#define GM__TA_ENUM(n, s) GM_TA_##n,
    GM_TRACE_ACTIONS(GM__TA_ENUM)
#undef GM__TA_ENUM
    GM_TA_COUNT
} gm_trace_action;

#endif /* GPUMEM_CORE_ACTION_H */
