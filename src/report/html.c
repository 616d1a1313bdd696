/* html.c — `gpumem report -o report.html`: one self-contained HTML file
 * (no network: the vendored uPlot, third_party/uplot, is inlined from the
 * copy the build embeds, cmake/embed.cmake). It holds the live bytes over
 * time stacked by category with allocated and reserved from the torch
 * policy replay, the breakdown at the peak and how it was attributed, the
 * fragmentation (reserved - allocated) over time, the segment map at the
 * peak and the frame / scope table (sortable). Tables are plain HTML, so
 * they read without JavaScript too. */
#include "report.h"

#include "internal.h"

#include <inttypes.h>
#include <string.h>

extern const unsigned char gm__uplot_js[], gm__uplot_css[];
extern const unsigned long gm__uplot_js_len, gm__uplot_css_len;

/* Category colours, in GM_CATEGORIES order (Tableau 10). */
static const char *const cat_color[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac"};
_Static_assert(sizeof cat_color / sizeof cat_color[0] == GM_CAT_COUNT, "a colour per category");

#define MAX_SEGMENTS 400
#define MAX_BLOCKS 40000

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}



static const char *CSS =
    "body{font:14px/1.4 system-ui,sans-serif;margin:20px 28px;color:#222}"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:26px 0 8px}"
    ".sub{color:#666;margin-bottom:12px}.kv{display:flex;gap:26px;flex-wrap:wrap;margin:10px 0}"
    ".kv div b{display:block;font-size:18px}.kv div span{color:#666;font-size:12px}"
    "table{border-collapse:collapse;font-size:13px}th,td{padding:3px 10px;border-bottom:1px solid #e4e4e4;"
    "text-align:right;white-space:nowrap}th{cursor:pointer;background:#f5f5f5}"
    "td:first-child,th:first-child{text-align:left}.sw{display:inline-block;width:11px;height:11px;"
    "margin-right:6px;vertical-align:-1px}.cols{display:flex;gap:40px;flex-wrap:wrap;align-items:flex-start}"
    ".seg{margin:2px 0;display:flex;align-items:center;gap:8px;font-size:11px}"
    ".seglab{width:250px;color:#555;font-family:monospace;flex:none}"
    ".segbar{position:relative;height:13px;background:#eee;border:1px solid #ccc;flex:none}"
    ".segbar span{position:absolute;top:0;bottom:0;min-width:1px}"
    ".note{color:#666;font-size:12px;max-width:1100px}td.nm{max-width:620px;overflow:hidden;"
    "text-overflow:ellipsis}";

static void summary(FILE *f, const gm_attribution *a, const gm_timeline *tl, const gm_report_opts *o) {
    char b[32];
    fprintf(f, "<h1>gpumem report: ");
    esc(f, o && o->title ? o->title : "trace");
    fprintf(f, "</h1><div class=sub>%s, device %d, %zu events, %zu allocations; replayed under the torch "
               "policy with conf \"",
            a->trace->format, a->device, a->nevents, a->nallocs);
    esc(f, tl->conf);
    fprintf(f, "\"%s</div>\n<div class=kv>", tl->oom ? " (ran out of the simulated device's memory)" : "");
    fprintf(f, "<div><span>peak requested (live tensors)</span><b id=peak-requested data-bytes=%" PRId64 ">%s</b></div>",
            a->peak_bytes, gm__report_bytes((double)a->peak_bytes, b, sizeof b));
    fprintf(f, "<div><span>peak allocated (replay)</span><b>%s</b></div>",
            gm__report_bytes((double)tl->peak_allocated, b, sizeof b));
    fprintf(f, "<div><span>peak reserved (replay)</span><b>%s</b></div>",
            gm__report_bytes((double)tl->peak_reserved, b, sizeof b));
    fprintf(f, "<div><span>reserved - allocated at their peaks</span><b>%s</b></div></div>\n",
            gm__report_bytes((double)(tl->peak_reserved - tl->peak_allocated), b, sizeof b));
}

/* The "stack by" control: categories, or scopes cut at each depth. */
static void stack_control(FILE *f, const gm_scope_series *ss) {
    if (!ss) return;
    fprintf(f, "<p class=note><label>Stack by <select id=stackby><option value=cat selected>category</option>");
    for (int i = 0; i < ss->nviews; i++) {
        const gm_scope_view *v = &ss->views[i];
        fprintf(f, "<option value=%d>scope, depth %d (%zu scope%s%s)</option>", i, v->depth, v->nscopes,
                v->nscopes == 1 ? "" : "s", v->nseries < v->nscopes ? ", top ones shown" : "");
    }
    fprintf(f, "</select></label> <span id=scope-source>Scopes from %s.", ss->source);
    if (ss->by_scope)
        fprintf(f, " A module path is cut at the depth: transformer.h.3.attn at depth 3 is transformer.h.3.");
    if (ss->by_frames)
        fprintf(f, " A torch snapshot names functions, not module instances: a scope is the path of module "
                   "forward calls (file:line of each call, outermost first), shared by every instance called "
                   "from that line; \"(self)\" is a forward's own code.");
    fprintf(f, " Scopes outside the top ones by bytes at the peak are summed in \"%s\"; allocations outside "
               "every scope are named by their phase in brackets.</span></p>\n", GM_SCOPE_OTHERS);
}

static void breakdown(FILE *f, const gm_attribution *a) {
    char b1[32], b2[32];
    uint64_t peak = (uint64_t)a->peak_bytes;
    fprintf(f, "<h2>Breakdown at the peak</h2><div class=cols><table id=peak-table><thead><tr><th>category</th>"
               "<th>live at peak</th><th>share</th><th>allocated in total</th><th>allocations</th></tr></thead><tbody>");
    for (int c = 0; c < GM_CAT_COUNT; c++) {
        uint64_t tot = 0, p = gm__attr_peak_cat(a, c);
        for (int m = 0; m < GM_AM_COUNT; m++) tot += a->bytes_by[c][m];
        fprintf(f, "<tr><td><span class=sw style=\"background:%s\"></span>%s</td><td data-v=%" PRIu64 ">%s</td>"
                   "<td>%.1f%%</td><td data-v=%" PRIu64 ">%s</td><td>%" PRIu64 "</td></tr>",
                cat_color[c], gm_category_name(c), p, gm__report_bytes((double)p, b1, sizeof b1), gm__report_pct(p, peak), tot,
                gm__report_bytes((double)tot, b2, sizeof b2), a->count_by[c]);
    }
    fprintf(f, "<tr><td><b>total</b></td><td data-v=%" PRIu64 "><b>%s</b></td><td>100%%</td><td></td><td>%zu</td>"
               "</tr></tbody></table>",
            peak, gm__report_bytes((double)peak, b1, sizeof b1), a->nallocs);
    fprintf(f, "<table><thead><tr><th>attributed by</th><th>bytes at peak</th><th>share</th><th "
               "style=\"text-align:left\">rule</th></tr></thead><tbody>");
    for (int m = 0; m < GM_AM_COUNT; m++) {
        uint64_t p = gm__attr_peak_method(a, m);
        fprintf(f, "<tr><td>%s</td><td>%s</td><td>%.1f%%</td><td style=\"text-align:left;white-space:normal;"
                   "max-width:460px\">%s</td></tr>",
                gm__attr_method_name(m), gm__report_bytes((double)p, b1, sizeof b1), gm__report_pct(p, peak), gm__attr_method_help(m));
    }
    fprintf(f, "</tbody></table></div>\n");
    char note[1024];
    if (!a->has_frames) fprintf(f, "<p class=note>%s</p>\n", gm__attr_frames_note(a, note, sizeof note));
    if (a->unknown_frees || a->double_allocs || a->oversized_allocs)
        fprintf(f, "<p class=note>Trace anomalies: %" PRIu64 " frees of unknown addresses (skipped), %" PRIu64
                   " allocations of live addresses (the old one kept live, as gpumem replay does), %" PRIu64
                   " allocations over GM_LIMIT_ALLOC_BYTES (counted as 0 bytes: gpumem replay skips them).</p>\n",
                a->unknown_frees, a->double_allocs, a->oversized_allocs);
}

static void segment_map(FILE *f, const gm_timeline *tl) {
    char b1[32], b2[32];
    uint64_t maxsz = 1, total = 0;
    for (size_t i = 0; i < tl->nsegs; i++) {
        if (tl->segs[i].total_size > maxsz) maxsz = tl->segs[i].total_size;
        total += tl->segs[i].total_size;
    }
    /* the largest MAX_SEGMENTS, shown in address order */
    uint64_t cut = 0;
    if (tl->nsegs > MAX_SEGMENTS) {
        size_t above;
        uint64_t lo = 0, hi = maxsz;
        while (lo < hi) { /* smallest cut with at most MAX_SEGMENTS at or above it */
            uint64_t mid = lo + (hi - lo) / 2;
            above = 0;
            for (size_t i = 0; i < tl->nsegs; i++) above += tl->segs[i].total_size > mid;
            if (above <= MAX_SEGMENTS) hi = mid;
            else lo = mid + 1;
        }
        cut = lo;
    }
    fprintf(f, "<h2>Segment map at the peak</h2><p class=note>%zu segments, %s reserved, at the peak of live "
               "bytes; bar length is the segment's size relative to the largest (%s), coloured blocks are "
               "the live allocations by category, grey is free space inside the segment.%s</p>\n<div id=segmap>",
            tl->nsegs, gm__report_bytes((double)total, b1, sizeof b1), gm__report_bytes((double)maxsz, b2, sizeof b2),
            cut ? " Only the largest segments are shown." : "");
    size_t blocks = 0;
    for (size_t i = 0; i < tl->nsegs; i++) {
        const gm_seg_map *s = &tl->segs[i];
        if (s->total_size <= cut) continue;
        double w = 100.0 * (double)s->total_size / (double)maxsz;
        fprintf(f, "<div class=seg><div class=seglab>0x%" PRIx64 " %s %s %.0f%%</div><div class=segbar "
                   "style=\"width:calc((100%% - 270px) * %.4f)\">",
                s->address, gm__report_bytes((double)s->total_size, b1, sizeof b1), s->large ? "L" : "S",
                gm__report_pct(s->allocated_size, s->total_size), (w < 0.5 ? 0.5 : w) / 100.0);
        for (size_t k = 0; k < s->nblocks && blocks < MAX_BLOCKS; k++, blocks++) {
            const gm_seg_block *bl = &s->blocks[k];
            fprintf(f, "<span style=\"left:%.3f%%;width:%.3f%%;background:%s\" title=\"%s %s\"></span>",
                    100.0 * (double)bl->offset / (double)s->total_size, 100.0 * (double)bl->size / (double)s->total_size,
                    cat_color[bl->cat], gm_category_name(bl->cat), gm__report_bytes((double)bl->size, b1, sizeof b1));
        }
        fprintf(f, "</div></div>\n");
    }
    fprintf(f, "</div>\n");
}

static void frame_table(FILE *f, const gm_attribution *a, const gm_frame_row *rows, size_t nrows,
                        const gm_report_opts *o) {
    char b[32], lab[1024];
    size_t max = o && o->max_rows ? o->max_rows : 300;
    fprintf(f, "<h2>Frames and scopes by memory</h2><p class=note>Like torch.profiler's key_averages().table("
               "sort_by=\"cuda_memory_usage\"), per Python function (name, file): <i>self</i> counts allocations "
               "whose innermost frame it is, <i>total</i> every allocation with it on the stack (once). "
               "<i>At peak</i>: still live at the peak. Click a column to sort.%s</p>\n",
            nrows > max ? " Only the first rows are shown (--rows N)." : "");
    fprintf(f, "<table id=frames><thead><tr><th>Name</th><th>Self at peak</th><th>Total at peak</th>"
               "<th>Self allocated</th><th>Total allocated</th><th>Self calls</th><th>Calls</th></tr></thead><tbody>\n");
    for (size_t r = 0; r < nrows && r < max; r++) {
        const gm_frame_row *x = &rows[r];
        fprintf(f, "<tr><td class=nm title=\"");
        if (x->name != UINT32_MAX && !x->scope) esc(f, a->trace->strings[x->filename]);
        fprintf(f, "\">");
        esc(f, gm__frame_row_label(a, x, lab, sizeof lab));
        uint64_t v[4] = {x->self_peak, x->total_peak, x->self_bytes, x->total_bytes};
        fprintf(f, "</td>");
        for (int k = 0; k < 4; k++) fprintf(f, "<td data-v=%" PRIu64 ">%s</td>", v[k], gm__report_bytes((double)v[k], b, sizeof b));
        fprintf(f, "<td>%" PRIu64 "</td><td>%" PRIu64 "</td></tr>\n", x->self_calls, x->total_calls);
    }
    fprintf(f, "</tbody></table>\n");
}

static void data_json(FILE *f, const gm_attribution *a, const gm_timeline *tl, const gm_scope_series *ss) {
    int64_t t0 = a->nevents ? a->ev[0].time_us : 0;
    bool use_time = a->nevents && a->ev[a->nevents - 1].time_us > t0;
    fprintf(f, "<script>const D={\"xlabel\":\"%s\",\"cats\":[", use_time ? "seconds" : "event");
    for (int c = 0; c < GM_CAT_COUNT; c++) fprintf(f, "%s\"%s\"", c ? "," : "", gm_category_name(c));
    fprintf(f, "],\"colors\":[");
    for (int c = 0; c < GM_CAT_COUNT; c++) fprintf(f, "%s\"%s\"", c ? "," : "", cat_color[c]);
    fprintf(f, "],\"peak\":{\"requested\":%" PRId64 ",\"t\":%.9g},\"t\":[", a->peak_bytes,
            tl->npts ? tl->pts[tl->peak_pt].t : 0.0);
    for (size_t i = 0; i < tl->npts; i++) fprintf(f, "%s%.9g", i ? "," : "", tl->pts[i].t);
    fprintf(f, "],\"c\":[");
    for (int c = 0; c < GM_CAT_COUNT; c++) {
        fprintf(f, "%s[", c ? "," : "");
        for (size_t i = 0; i < tl->npts; i++) fprintf(f, "%s%" PRId64, i ? "," : "", tl->pts[i].cat[c]);
        fprintf(f, "]");
    }
    fprintf(f, "],\"alloc\":[");
    for (size_t i = 0; i < tl->npts; i++) fprintf(f, "%s%" PRId64, i ? "," : "", tl->pts[i].allocated);
    fprintf(f, "],\"res\":[");
    for (size_t i = 0; i < tl->npts; i++) fprintf(f, "%s%" PRId64, i ? "," : "", tl->pts[i].reserved);
    fprintf(f, "],\"title\":");
    gm__json_string(f, a->trace->format, true);
    if (ss) {
        fprintf(f, ",\"others\":");
        gm__json_string(f, GM_SCOPE_OTHERS, true);
        fprintf(f, ",\"scopes\":");
        gm__scope_series_json(f, ss, true);
    }
    fprintf(f, "};</script>\n");
}

static const char *JS =
    "function fmt(b){const u=['B','KiB','MiB','GiB','TiB'];let i=0,v=Math.abs(b);while(v>=1024&&i<4){v/=1024;i++}"
    "return (b<0?'-':'')+v.toFixed(2)+' '+u[i]}\n"
    "const W=Math.max(600,Math.min(1340,window.innerWidth-60)),step=uPlot.paths.stepped({align:1});\n"
    "function peakLine(u){const x=u.valToPos(D.peak.t,'x',true),c=u.ctx;c.save();c.strokeStyle='#c00';"
    "c.setLineDash([5,3]);c.lineWidth=1.5;c.beginPath();c.moveTo(x,u.bbox.top);c.lineTo(x,u.bbox.top+u.bbox.height);"
    "c.stroke();c.restore()}\n"
    "const yax={values:(u,vs)=>vs.map(fmt),size:86};\n"
    /* the stacked timeline: by category, or by scope at a depth (the
     * #stackby control); scope series come as deltas, summed here once */
    "const PAL=['#4e79a7','#f28e2b','#e15759','#76b7b2','#59a14f','#edc948','#b07aa1','#ff9da7','#9c755f',"
    "'#17becf','#bcbd22','#1f77b4','#8c564b','#e377c2','#7f7f7f','#aec7e8'];\n"
    "const S=D.scopes;if(S)S.views.forEach(v=>v.series.forEach(s=>{let c=0;s.v=s.deltas.map(d=>c+=d)}));\n"
    "function groups(m){if(m==='cat'||!S)return D.cats.map((n,k)=>({name:n,color:D.colors[k],v:D.c[k]}));"
    "return S.views[+m].series.map((s,j)=>({name:s.name,color:s.name===D.others?'#bab0ac':PAL[j%PAL.length],v:s.v}))}\n"
    "let chart=null;\n"
    "function drawTimeline(m){const G=groups(m),n=D.t.length,cum=[];let acc=new Array(n).fill(0);"
    "G.forEach(g=>{acc=acc.map((v,i)=>v+g.v[i]);cum.push(acc)});"
    "const data=[D.t],series=[{label:D.xlabel}];"
    "for(let k=G.length-1;k>=0;k--){const g=G[k];data.push(cum[k]);series.push({label:g.name,fill:g.color,"
    "stroke:g.color,width:0,paths:step,value:(u,v,si,i)=>i==null?'--':fmt(g.v[i])})}"
    "data.push(D.alloc);series.push({label:'allocated (replay)',stroke:'#444',width:1,dash:[4,3],paths:step,"
    "value:(u,v)=>v==null?'--':fmt(v)});"
    "data.push(D.res);series.push({label:'reserved (replay)',stroke:'#111',width:1.5,paths:step,"
    "value:(u,v)=>v==null?'--':fmt(v)});"
    "if(chart)chart.destroy();"
    "chart=new uPlot({width:W,height:400,series,scales:{x:{time:false}},axes:[{label:D.xlabel},yax],"
    "hooks:{draw:[peakLine]}},data,document.getElementById('timeline'))}\n"
    /* #stack=N in the address opens the view of depth index N (a link to it) */
    "(function(){const sel=document.getElementById('stackby'),h=/stack=(cat|\\d+)/.exec(location.hash);"
    "if(sel&&h&&[...sel.options].some(o=>o.value===h[1]))sel.value=h[1];"
    "if(sel)sel.onchange=()=>{drawTimeline(sel.value);history.replaceState(null,'','#stack='+sel.value)};"
    "drawTimeline(sel?sel.value:'cat');"
    "const fr=D.res.map((r,i)=>r-D.alloc[i]);"
    "new uPlot({width:W,height:220,series:[{label:D.xlabel},{label:'reserved - allocated',fill:'#f4a58280',"
    "stroke:'#d6604d',width:1,paths:step,value:(u,v)=>v==null?'--':fmt(v)}],scales:{x:{time:false}},"
    "axes:[{label:D.xlabel},yax],hooks:{draw:[peakLine]}},[D.t,fr],document.getElementById('frag'))})();\n"
    "document.querySelectorAll('table').forEach(t=>t.querySelectorAll('th').forEach((th,ci)=>th.onclick=()=>{"
    "const tb=t.tBodies[0],rs=[...tb.rows],d=th.dataset.d==='1'?-1:1;th.dataset.d=d===1?'0':'1';"
    "const val=r=>{const c=r.cells[ci];return c.dataset.v!==undefined?+c.dataset.v:(isNaN(+c.textContent)?"
    "c.textContent:+c.textContent)};rs.sort((a,b)=>{const x=val(a),y=val(b);return (x<y?1:x>y?-1:0)*d});"
    "rs.forEach(r=>tb.appendChild(r))}));\n";

int gm__report_write_html(FILE *f, const gm_attribution *a, const gm_timeline *tl, const gm_frame_row *rows,
                         size_t nrows, const gm_report_opts *o) {
    fprintf(f, "<!doctype html>\n<html lang=en><head><meta charset=utf-8>\n"
               "<meta name=generator content=\"gpumem report\">\n"
               "<meta name=gpumem-peak-requested content=\"%" PRId64 "\">\n<title>gpumem report: ",
            a->peak_bytes);
    esc(f, o && o->title ? o->title : "trace");
    fprintf(f, "</title>\n<style>");
    fwrite(gm__uplot_css, 1, gm__uplot_css_len, f);
    fprintf(f, "\n%s</style>\n<script>", CSS);
    fwrite(gm__uplot_js, 1, gm__uplot_js_len, f);
    fprintf(f, "</script>\n</head><body>\n");
    summary(f, a, tl, o);
    fprintf(f, "<h2>Memory over time, stacked by category or scope</h2><p class=note>Live requested bytes per "
               "category or per scope "
               "(%zu points kept of %zu events: the minimum and maximum of each bucket, so no peak is "
               "dropped), with allocated and reserved bytes from replaying the trace under the torch policy. "
               "The red line marks the peak.</p>\n",
            tl->npts, a->nevents);
    stack_control(f, o ? o->scopes : NULL);
    fprintf(f, "<div id=timeline></div>\n");
    breakdown(f, a);
    fprintf(f, "<h2>Fragmentation over time</h2><p class=note>Reserved minus allocated bytes in the replay: "
               "memory the caching allocator holds in segments but no tensor uses.</p><div id=frag></div>\n");
    segment_map(f, tl);
    frame_table(f, a, rows, nrows, o);
    data_json(f, a, tl, o ? o->scopes : NULL);
    fprintf(f, "<script>%s</script>\n</body></html>\n", JS);
    return ferror(f) ? -1 : 0;
}
