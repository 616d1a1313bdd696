/* text.c — `gpumem report --text`: the peak breakdown by category, how the
 * bytes were attributed, and the frame / scope table, on a terminal. */
#include "report.h"

#include "internal.h"

#include <inttypes.h>
#include <string.h>


int gm__report_write_text(FILE *f, const gm_attribution *a, const gm_timeline *tl, const gm_frame_row *rows,
                         size_t nrows, const gm_report_opts *o) {
    char b1[32], b2[32], b3[32], b4[32], lab[512];
    uint64_t peak = (uint64_t)a->peak_bytes;
    fprintf(f, "trace      %s (%s, device %d, %zu events, %zu allocations)\n", o && o->title ? o->title : "-",
            a->trace->format, a->device, a->nevents, a->nallocs);
    if (tl) {
        fprintf(f, "replayed   under the torch policy, conf \"%s\"%s\n", tl->conf,
                tl->oom ? " (ran out of the simulated device's memory)" : "");
        fprintf(f, "peak       requested %s, allocated %s, reserved %s (fragmentation at the peak of "
                   "reserved: %s)\n",
                gm__report_bytes((double)tl->peak_requested, b1, sizeof b1), gm__report_bytes((double)tl->peak_allocated, b2, sizeof b2),
                gm__report_bytes((double)tl->peak_reserved, b3, sizeof b3),
                gm__report_bytes((double)(tl->peak_reserved - tl->peak_allocated), b4, sizeof b4));
    }
    fprintf(f, "\nAt the peak of live requested bytes (%s, %" PRId64 " bytes, event %zu):\n\n",
            gm__report_bytes((double)peak, b1, sizeof b1), a->peak_bytes, a->peak_ev);
    fprintf(f, "  %-16s %12s %7s %12s %10s\n", "category", "at peak", "share", "allocated", "allocs");
    for (int c = 0; c < GM_CAT_COUNT; c++) {
        uint64_t tot = 0;
        for (int m = 0; m < GM_AM_COUNT; m++) tot += a->bytes_by[c][m];
        uint64_t p = gm__attr_peak_cat(a, c);
        fprintf(f, "  %-16s %12s %6.1f%% %12s %10" PRIu64 "\n", gm_category_name(c), gm__report_bytes((double)p, b1, sizeof b1),
                gm__report_pct(p, peak), gm__report_bytes((double)tot, b2, sizeof b2), a->count_by[c]);
    }
    fprintf(f, "\nHow the bytes at the peak were attributed:\n\n");
    for (int m = 0; m < GM_AM_COUNT; m++) {
        uint64_t p = gm__attr_peak_method(a, m);
        fprintf(f, "  %-9s %12s %6.1f%%  %s\n", gm__attr_method_name(m), gm__report_bytes((double)p, b1, sizeof b1),
                gm__report_pct(p, peak), gm__attr_method_help(m));
    }
    if (!a->has_frames) fprintf(f, "\n  %s\n", gm__attr_frames_note(a, lab, sizeof lab));
    if (a->unknown_frees || a->double_allocs || a->oversized_allocs)
        fprintf(f, "\n  trace anomalies: %" PRIu64 " frees of unknown addresses, %" PRIu64
                   " allocs of live addresses (kept live, as replay does), %" PRIu64
                   " allocs over GM_LIMIT_ALLOC_BYTES (0 bytes: replay skips them)\n",
                a->unknown_frees, a->double_allocs, a->oversized_allocs);
    size_t max = o && o->max_rows ? o->max_rows : 30;
    fprintf(f, "\nFrames and scopes by memory live at the peak (self: innermost frame; total: "
               "anywhere on the stack):\n\n");
    fprintf(f, "  %-60s %11s %11s %11s %11s %8s\n", "Name", "Self peak", "Total peak", "Self alloc",
            "Total alloc", "Calls");
    for (size_t r = 0; r < nrows && r < max; r++) {
        gm__frame_row_label(a, &rows[r], lab, sizeof lab);
        if (strlen(lab) > 60) strcpy(lab + 57, "...");
        fprintf(f, "  %-60s %11s %11s %11s %11s %8" PRIu64 "\n", lab,
                gm__report_bytes((double)rows[r].self_peak, b1, sizeof b1), gm__report_bytes((double)rows[r].total_peak, b2, sizeof b2),
                gm__report_bytes((double)rows[r].self_bytes, b3, sizeof b3), gm__report_bytes((double)rows[r].total_bytes, b4, sizeof b4),
                rows[r].total_calls);
    }
    if (nrows > max) fprintf(f, "  ... %zu more rows (--rows N)\n", nrows - max);
    return ferror(f) ? -1 : 0;
}

int gm__report_write_json(FILE *f, const gm_attribution *a, const gm_timeline *tl, const gm_report_opts *o) {
    fprintf(f, "{\"trace\":");
    gm__json_string(f, o && o->title ? o->title : "", false);
    fprintf(f, ",\"format\":\"%s\",\"device\":%d,\"events\":%zu,\"allocations\":%zu,\"has_frames\":%s,"
               "\"peak_requested\":%" PRId64 ",\"peak_event\":%zu",
            a->trace->format, a->device, a->nevents, a->nallocs, a->has_frames ? "true" : "false",
            a->peak_bytes, a->peak_ev);
    if (tl)
        fprintf(f, ",\"replay\":{\"policy\":\"torch\",\"peak_requested\":%" PRId64 ",\"peak_allocated\":%" PRId64
                   ",\"peak_reserved\":%" PRId64 ",\"oom\":%s}",
                tl->peak_requested, tl->peak_allocated, tl->peak_reserved, tl->oom ? "true" : "false");
    fprintf(f, ",\"categories\":{");
    for (int c = 0; c < GM_CAT_COUNT; c++) {
        uint64_t tot = 0;
        for (int m = 0; m < GM_AM_COUNT; m++) tot += a->bytes_by[c][m];
        fprintf(f, "%s\"%s\":{\"peak\":%" PRIu64 ",\"allocated\":%" PRIu64 ",\"count\":%" PRIu64 ",\"peak_by\":{",
                c ? "," : "", gm_category_name(c), gm__attr_peak_cat(a, c), tot, a->count_by[c]);
        for (int m = 0; m < GM_AM_COUNT; m++)
            fprintf(f, "%s\"%s\":%" PRIu64, m ? "," : "", gm__attr_method_name(m), a->peak_by[c][m]);
        fprintf(f, "}}");
    }
    fprintf(f, "},\"methods\":{");
    for (int m = 0; m < GM_AM_COUNT; m++)
        fprintf(f, "%s\"%s\":%" PRIu64, m ? "," : "", gm__attr_method_name(m), gm__attr_peak_method(a, m));
    fprintf(f, "},\"unknown_frees\":%" PRIu64 ",\"double_allocs\":%" PRIu64 ",\"oversized_allocs\":%" PRIu64,
            a->unknown_frees, a->double_allocs, a->oversized_allocs);
    if (!a->has_frames) {
        char note[1024];
        fprintf(f, ",\"steps_inferred\":%zu,\"record_frames\":", a->nsteps);
        gm__json_string(f, GM_RECORD_FRAMES_CALL, false);
        fprintf(f, ",\"note\":");
        gm__json_string(f, gm__attr_frames_note(a, note, sizeof note), false);
    }
    if (tl && o && o->scopes) {
        /* the timeline's points (x of the scope series) and the series the
         * HTML's "stack by scope" draws */
        int64_t t0 = a->nevents ? a->ev[0].time_us : 0;
        bool use_time = a->nevents && a->ev[a->nevents - 1].time_us > t0;
        fprintf(f, ",\"timeline\":{\"x\":\"%s\",\"peak_point\":%zu,\"t\":[", use_time ? "seconds" : "event",
                tl->peak_pt);
        for (size_t i = 0; i < tl->npts; i++) fprintf(f, "%s%.9g", i ? "," : "", tl->pts[i].t);
        fprintf(f, "],\"event\":[");
        for (size_t i = 0; i < tl->npts; i++) fprintf(f, "%s%" PRIu32, i ? "," : "", tl->pts[i].ev);
        fprintf(f, "]},\"scopes\":");
        gm__scope_series_json(f, o->scopes, false);
    }
    fprintf(f, "}\n");
    return ferror(f) ? -1 : 0;
}
