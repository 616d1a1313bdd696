/* perfetto.c — `gpumem report --perfetto`: Chrome trace event JSON, which
 * ui.perfetto.dev and chrome://tracing load: one counter track of live
 * bytes per category, one of allocated / reserved / fragmentation from the
 * replay, slices for the phases (forward, backward, optimizer step, ...)
 * and for gpumem scopes, both cut at allocations. */
#include "report.h"

#include "internal.h"

#include <inttypes.h>
#include <string.h>


/* The innermost scope frame of a stack, or NULL. */
static const char *scope_of(const gm_trace *t, uint32_t stack) {
    if (!stack) return NULL;
    for (uint32_t k = t->stack_off[stack - 1]; k < t->stack_off[stack]; k++) {
        const gm_trace_frame *fr = &t->frames[t->stack_frames[k]];
        if (!strcmp(t->strings[fr->filename], GM_TAG_SCOPE_FILE)) return t->strings[fr->name];
    }
    return NULL;
}

int gm__report_write_perfetto(FILE *f, const gm_attribution *a, const gm_timeline *tl) {
    const gm_trace *t = a->trace;
    int64_t t0 = a->nevents ? a->ev[0].time_us : 0;
    bool use_time = a->nevents && a->ev[a->nevents - 1].time_us > t0;
#define TS(i) (use_time ? (double)(a->ev[i].time_us - t0) : (double)(i))
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":\"gpumem report\",\"time\":\"%s\"},"
               "\"traceEvents\":[\n",
            use_time ? "microseconds since the first event" : "event index (the trace has no times)");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"device %d\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"phases\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"scopes\"}}",
            a->device);
    for (size_t i = 0; tl && i < tl->npts; i++) {
        const gm_tl_point *p = &tl->pts[i];
        double ts = TS(p->ev);
        fprintf(f, ",\n{\"name\":\"live bytes by category\",\"ph\":\"C\",\"pid\":1,\"ts\":%.0f,\"args\":{", ts);
        for (int c = 0; c < GM_CAT_COUNT; c++)
            fprintf(f, "%s\"%s\":%" PRId64, c ? "," : "", gm_category_name(c), p->cat[c]);
        fprintf(f, "}},\n{\"name\":\"allocator (torch policy replay)\",\"ph\":\"C\",\"pid\":1,\"ts\":%.0f,"
                   "\"args\":{\"allocated\":%" PRId64 ",\"fragmentation\":%" PRId64 "}}",
                ts, p->allocated, p->reserved - p->allocated);
    }
    /* slices: runs of allocations in one phase / one scope */
    for (int track = 1; track <= 2; track++) {
        size_t start = 0;
        const char *name = NULL;
        for (size_t k = 0; k <= a->nallocs; k++) {
            const char *nm = NULL;
            if (k < a->nallocs)
                nm = track == 1 ? gm__phase_name(a->allocs[k].phase) : scope_of(t, a->allocs[k].stack);
            if (k < a->nallocs && nm == name) continue;
            if (name && k > start) {
                uint32_t e0 = a->allocs[start].ev;
                uint32_t e1 = k < a->nallocs ? a->allocs[k].ev : (uint32_t)(a->nevents - 1);
                fprintf(f, ",\n{\"name\":");
                gm__json_string(f, name, false);
                fprintf(f, ",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.0f,\"dur\":%.0f,\"args\":{\"allocations\":%zu}}",
                        track, TS(e0), TS(e1) - TS(e0), k - start);
            }
            name = nm;
            start = k;
        }
    }
#undef TS
    fprintf(f, "\n]}\n");
    return ferror(f) ? -1 : 0;
}
