/* cmd_top.c — `gpumem top`: a live ncurses view of GPU memory. Per device a
 * header (NVML total/reserved/used/free and the allocators' sums), a
 * per-process table that can be sorted and filtered, and a history graph of
 * the selected device's bytes over a selectable window with OOM markers.
 * Sampling runs on its own thread (gm__sampler); the UI only redraws. */
#define _GNU_SOURCE /* strcasestr */
#include "cli.h"

#include "monitor/monitor.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Parses top's options; returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, double *interval, bool *nvml, bool *all) {
    bool no_nvml = false;
    const struct cli_opt opts[] = {
        CLI_OPT_INTERVAL(interval, "0.5"),
        CLI_OPT_NO_NVML(&no_nvml),
        CLI_OPT_ALL_USERS(all),
    };
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "", .opts = opts, .nopts = CLI_NOPTS(opts),
        .about = "Live view of every GPU (NVML) and every process publishing gpumem allocator\n"
                 "stats. Keys: q quit, s sort column, r reverse, f filter, d device,\n"
                 "w graph window, p pause, h help.",
    };
    int rc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return cli_parse_exit(rc);
    *nvml = !no_nvml;
    return -1;
}

#ifndef GM_HAVE_CURSES
int cmd_top(int argc, char **argv) {
    double interval = 0.5;
    bool nvml = true, all = false;
    int rc = parse_args(argc, argv, &interval, &nvml, &all);
    if (rc >= 0) return rc;
    return cli_error(argv[0], "this gpumem was built without ncurses (install libncurses-dev and rebuild); "
                              "try 'gpumem smi' or 'gpumem log'");
}
#else
#include <curses.h>

#define HIST_CAP 36000 /* an hour at 10 samples/s */

typedef struct hist_point {
    double t;            /* seconds, CLOCK_REALTIME */
    int64_t allocated;   /* sum over the device's processes */
    int64_t reserved;
    int64_t nvml_used;   /* -1 when unknown */
    bool oom;            /* a process's num_ooms grew since the previous sample */
} hist_point;

typedef struct history {
    hist_point *p;
    int start, n;
    int64_t last_ooms;
} history;

/* job (the default): grouped by run id, then rank, as gpumem smi groups */
enum { SORT_JOB, SORT_RESERVED, SORT_ALLOCATED, SORT_NVML, SORT_PEAK, SORT_PID, SORT_NAME, SORT_COUNT };
static const char *sort_names[SORT_COUNT] = {"job", "reserved", "allocated", "nvml-used", "peak", "pid", "name"};
static const double windows[] = {30, 60, 300, 900, 3600};
#define NWINDOWS (int)(sizeof windows / sizeof windows[0])

typedef struct ui {
    gm__mon_sample s;
    uint64_t seq;
    history hist[GM_MAX_DEVICES];
    int sort, window, device;
    bool reverse, paused, help, editing;
    char filter[64], edit[64];
    double interval;
} ui;

static void hist_add(history *h, const gm__mon_sample *s, int dev) {
    if (!h->p && !(h->p = calloc(HIST_CAP, sizeof *h->p))) return;
    hist_point pt = {.t = (double)s->time_ns / 1e9, .nvml_used = -1};
    int64_t ooms = 0;
    for (int i = 0; i < s->nrows; i++) {
        const gm__mon_row *r = &s->rows[i];
        if (r->device != dev || !r->have_alloc) continue;
        pt.allocated += r->v.allocated;
        pt.reserved += r->v.reserved;
        ooms += r->v.num_ooms;
    }
    if (dev < s->ndevices && s->devs[dev].have_mem) pt.nvml_used = (int64_t)s->devs[dev].used;
    pt.oom = h->n > 0 && ooms > h->last_ooms;
    h->last_ooms = ooms;
    int at = (h->start + h->n) % HIST_CAP;
    h->p[at] = pt;
    if (h->n < HIST_CAP) h->n++;
    else h->start = (h->start + 1) % HIST_CAP;
}

static const char *fmt(bool have, long long v, char *buf) {
    if (!have) return "-";
    return cli_format_bytes(v < 0 ? 0 : (uint64_t)v, buf, 24);
}

static long long sort_key(const ui *u, const gm__mon_row *r) {
    switch (u->sort) {
    case SORT_RESERVED: return r->have_alloc ? r->v.reserved : -1;
    case SORT_ALLOCATED: return r->have_alloc ? r->v.allocated : -1;
    case SORT_NVML: return r->have_nvml_used ? (long long)r->nvml_used : -1;
    case SORT_PEAK: return r->have_alloc ? r->v.peak_reserved : -1;
    default: return r->pid;
    }
}

static const ui *sort_ui;
static int row_order(const void *a, const void *b) {
    const gm__mon_row *x = a, *y = b;
    int c;
    if (sort_ui->sort == SORT_NAME) c = strcasecmp(x->label, y->label);
    else if (sort_ui->sort == SORT_JOB) {
        bool xj = x->id.run_id[0] != '\0', yj = y->id.run_id[0] != '\0';
        c = xj != yj ? (xj ? -1 : 1) : strcmp(x->id.run_id, y->id.run_id);
        if (!c) c = x->id.rank - y->id.rank;
    } else {
        long long kx = sort_key(sort_ui, x), ky = sort_key(sort_ui, y);
        c = kx < ky ? 1 : kx > ky ? -1 : 0; /* big first */
        if (sort_ui->sort == SORT_PID) c = -c;
    }
    if (!c) c = x->pid - y->pid;
    return sort_ui->reverse ? -c : c;
}

/* One screen line, cut at the terminal's width: a line never wraps into the
 * next (a narrow terminal shows the left part of each). */
static void put_line(int y, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_line(int y, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (y < 0 || y >= LINES) return;
    move(y, 0);
    clrtoeol();
    mvaddnstr(y, 0, buf, COLS);
}

static int draw_devices(const ui *u, int y) {
    char b1[24], b2[24], b3[24], b4[24], b5[24], b6[24];
    for (int d = 0; d < u->s.ndevices && y < LINES - 8; d++, y++) {
        const gm__mon_dev *v = &u->s.devs[d];
        int64_t al = 0, re = 0;
        for (int i = 0; i < u->s.nrows; i++)
            if (u->s.rows[i].device == d && u->s.rows[i].have_alloc) {
                al += u->s.rows[i].v.allocated;
                re += u->s.rows[i].v.reserved;
            }
        if (d == u->device) attron(A_BOLD);
        put_line(y, "%cGPU %d %-.20s  total %s  drv-reserved %s  used %s  free %s | allocators: alloc %s reserved %s",
                 d == u->device ? '>' : ' ', d, v->have_info ? v->name : "", fmt(v->have_mem || v->have_alloc_total, (long long)v->total, b1),
                 fmt(v->have_reserved, (long long)v->reserved, b2), fmt(v->have_mem, (long long)v->used, b3),
                 fmt(v->have_mem, (long long)v->free, b4), fmt(true, al, b5), fmt(true, re, b6));
        if (d == u->device) attroff(A_BOLD);
    }
    return y;
}

/* The process table's columns, in screen order: the identity columns, then
 * the published statistics that have one (GM_MON_STATS in monitor.h, the
 * same columns as gpumem smi). A narrow terminal gets the essential ones
 * (table_layout): at 80 columns the whole table was cut after "Allocated". */
typedef struct tcol {
    const char *name, *head;
    int width;
    bool counter, left;
} tcol;
#define GM__TOP_STAT(nm, val, torch, prom, type, help, col) \
    {#nm, col, sizeof(#type) == sizeof("counter") ? 7 : 11, sizeof(#type) == sizeof("counter"), false},
static const tcol all_cols[] = {
    {"gpu", "GPU", 4, false, true},
    {"pid", "PID", 8, false, true},
    {"process", "PROCESS", 24, false, true},
    {"job", "JOB", 12, false, true},
    {"rank", "RANK", 5, false, false},
    {"nvml_used", "NVML used", 11, false, false},
    GM_MON_STATS(GM__TOP_STAT)
};
#undef GM__TOP_STAT
#define NCOLS ((int)(sizeof all_cols / sizeof all_cols[0]))
#define TC_PROCESS 2
#define TC_STATS 6 /* the first statistic */
#define PROCESS_MIN 14

/* Which columns fit `cols` characters, and the PROCESS width: GPU, PID and
 * PROCESS always, then by what a user needs first (allocated and reserved,
 * OOMs, the cache, retries, NVML's view, peak, the job), then PROCESS grows
 * to its full width with what is left. At 80 columns: GPU, PID, PROCESS,
 * Allocated, Reserved, OOMs, Res-unalloc, Retries. */
static int table_layout(int cols, bool show[NCOLS]) {
    static const char *const priority[] = {"allocated", "reserved", "num_ooms", "reserved_unallocated",
                                           "num_alloc_retries", "nvml_used", "peak_reserved", "job", "rank"};
    int used = -1;
    for (int c = 0; c < NCOLS; c++) {
        show[c] = c <= TC_PROCESS;
        if (show[c]) used += 1 + (c == TC_PROCESS ? PROCESS_MIN : all_cols[c].width);
    }
    bool room = true;
    for (size_t k = 0; k < sizeof priority / sizeof priority[0] && room; k++)
        for (int c = 0; c < NCOLS; c++)
            if (all_cols[c].head && !strcmp(all_cols[c].name, priority[k])) {
                room = used + 1 + all_cols[c].width <= cols; /* strictly in order: stop at the first too wide */
                if (room) used += 1 + all_cols[c].width;
                show[c] = room;
            }
    int pw = PROCESS_MIN + (cols - used);
    return pw > all_cols[TC_PROCESS].width ? all_cols[TC_PROCESS].width : pw < PROCESS_MIN ? PROCESS_MIN : pw;
}

/* cell text at its column's width, the separating space ahead */
static int put_cell(char *line, int n, int len, const tcol *c, int width, const char *text) {
    if (n >= len) return n;
    return n + snprintf(line + n, (size_t)(len - n), "%s%*.*s", n ? " " : "", c->left ? -width : width, width, text);
}

static int draw_table(ui *u, int y, int max_rows) {
    char b1[24], line[1024], cell[64];
    bool show[NCOLS];
    int pw = table_layout(COLS, show), n = 0;
    for (int c = 0; c < NCOLS; c++)
        if (show[c]) n = put_cell(line, n, (int)sizeof line, &all_cols[c], c == TC_PROCESS ? pw : all_cols[c].width,
                                  all_cols[c].head);
    attron(A_REVERSE);
    put_line(y, "%-*s", COLS < (int)sizeof line ? COLS : (int)sizeof line - 1, line);
    y++;
    attroff(A_REVERSE);
    sort_ui = u;
    gm__mon_row *rows = u->s.rows;
    if (u->s.nrows > 1) qsort(rows, (size_t)u->s.nrows, sizeof *rows, row_order);
    int shown = 0;
    for (int i = 0; i < u->s.nrows && shown < max_rows; i++) {
        const gm__mon_row *r = &rows[i];
        if (u->filter[0] && !strcasestr(r->label, u->filter) && !strcasestr(r->comm, u->filter) &&
            !strcasestr(r->id.run_id, u->filter))
            continue;
        char name[33], job[13], rank[12] = "-", pid[16];
        gm__format_printable(name, r->label, sizeof name);
        gm__format_printable(job, r->id.run_id[0] ? r->id.run_id : "-", sizeof job);
        if (r->id.rank >= 0) snprintf(rank, sizeof rank, "%d", r->id.rank);
        bool a = r->have_alloc;
        const gm__shm_values *v = &r->v;
        long long vals[NCOLS] = {0};
        int k = TC_STATS;
#define GM__TOP_VAL(nm, val, torch, prom, type, help, col) vals[k++] = (long long)(val);
        GM_MON_STATS(GM__TOP_VAL)
#undef GM__TOP_VAL
        n = 0;
        for (int c = 0; c < NCOLS; c++) {
            if (!show[c]) continue;
            const char *text = cell;
            switch (c) {
            case 0: snprintf(cell, sizeof cell, "%d", r->device); break;
            case 1: text = gm__format_pid(r, pid, sizeof pid); break;
            case TC_PROCESS: text = name; break;
            case 3: text = job; break;
            case 4: text = rank; break;
            case 5: text = fmt(r->have_nvml_used, (long long)r->nvml_used, b1); break;
            default:
                if (!a) text = "-";
                else if (all_cols[c].counter) snprintf(cell, sizeof cell, "%lld", vals[c]);
                else text = fmt(true, vals[c], b1);
            }
            n = put_cell(line, n, (int)sizeof line, &all_cols[c], c == TC_PROCESS ? pw : all_cols[c].width, text);
        }
        put_line(y++, "%s", line);
        shown++;
    }
    if (!shown)
        put_line(y++, "%s", u->filter[0] ? "(no process matches the filter)"
                                         : "(no processes: run a job under gpumem, or 'gpumem demo' to try)");
    gm__sbuf note = {0}; /* what pid? and pid^ mean, as in gpumem smi */
    gm__format_pid_note(&u->s, &note);
    for (char *save, *l = note.p ? strtok_r(note.p, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save))
        put_line(y++, "%s", l);
    gm__sbuf_free(&note);
    return y;
}

/* Bucket the window into one column per character: the max of each. */
static void draw_graph(const ui *u, int top, int height) {
    const history *h = &u->hist[u->device];
    int width = COLS - 12;
    if (height < 3 || width < 10 || !h->p || !h->n) return;
    double win = windows[u->window], end = h->p[(h->start + h->n - 1) % HIST_CAP].t, begin = end - win;
    int64_t *al = calloc((size_t)width, sizeof *al), *re = calloc((size_t)width, sizeof *re);
    bool *oom = calloc((size_t)width, sizeof *oom), *seen = calloc((size_t)width, sizeof *seen);
    int64_t maxv = 1;
    for (int i = 0; al && re && oom && seen && i < h->n; i++) {
        const hist_point *p = &h->p[(h->start + i) % HIST_CAP];
        if (p->t < begin) continue;
        int c = (int)((p->t - begin) / win * (width - 1));
        c = c < 0 ? 0 : c >= width ? width - 1 : c;
        int64_t r = p->reserved > p->nvml_used ? p->reserved : p->nvml_used;
        if (p->allocated > al[c]) al[c] = p->allocated;
        if (r > re[c]) re[c] = r;
        oom[c] |= p->oom;
        seen[c] = true;
        if (r > maxv) maxv = r;
    }
    /* a bucket with no sample holds the previous one's values: the memory did
     * not drop to zero between two samples, there was just no sample there */
    for (int c = 1; al && re && seen && c < width; c++)
        if (!seen[c] && seen[c - 1]) {
            al[c] = al[c - 1];
            re[c] = re[c - 1];
            seen[c] = true;
        }
    char b1[24];
    put_line(top, "GPU %d, last %.0fs: '#' allocated, ':' reserved (or NVML used), X = OOM", u->device, win);
    for (int row = 0; al && re && oom && seen && row < height - 1; row++) {
        int y = top + 1 + row;
        double level = (double)maxv * (height - 1 - row) / (height - 1);
        if (row == 0) mvprintw(y, 0, "%10s", cli_format_bytes((uint64_t)maxv, b1, sizeof b1));
        for (int c = 0; c < width; c++) {
            char ch = ' ';
            if (row == 0 && oom[c]) ch = 'X';
            else if (seen[c] && (double)al[c] >= level) ch = '#';
            else if (seen[c] && (double)re[c] >= level) ch = ':';
            mvaddch(y, 11 + c, (chtype)ch);
        }
    }
    free(al);
    free(re);
    free(oom);
    free(seen);
}

static void draw(ui *u) {
    erase();
    attron(A_BOLD);
    put_line(0, "gpumem top  interval %.2gs  window %.0fs  sort %s%s  filter '%s'%s", u->interval,
             windows[u->window], sort_names[u->sort], u->reverse ? " (reversed)" : "", u->filter,
             u->paused ? "  [PAUSED]" : "");
    attroff(A_BOLD);
    int y = 1;
    if (u->s.nvml_note[0]) put_line(y++, "%s", u->s.nvml_note);
    y = draw_devices(u, y);
    int graph_h = LINES / 3 > 4 ? LINES / 3 : 4;
    y = draw_table(u, y + 1, LINES - y - graph_h - 4);
    draw_graph(u, LINES - graph_h - 2, graph_h);
    if (u->editing) put_line(LINES - 1, "filter: %s_  (Enter apply, Esc cancel)", u->edit);
    else if (u->help)
        put_line(LINES - 1, "q quit | s sort column | r reverse | f filter | d next GPU | w window | p pause | h help");
    else put_line(LINES - 1, "q quit  s sort  r reverse  f filter  d device  w window  p pause  h help");
    refresh();
}

/* Returns false to quit. */
static bool key(ui *u, int ch) {
    if (u->editing) {
        size_t n = strlen(u->edit);
        if (ch == '\n' || ch == KEY_ENTER || ch == '\r') {
            memcpy(u->filter, u->edit, sizeof u->filter);
            u->editing = false;
        } else if (ch == 27) u->editing = false;
        else if ((ch == KEY_BACKSPACE || ch == 127 || ch == 8) && n) u->edit[n - 1] = '\0';
        else if (ch >= 32 && ch < 127 && n + 1 < sizeof u->edit) {
            u->edit[n] = (char)ch;
            u->edit[n + 1] = '\0';
        }
        return true;
    }
    switch (ch) {
    case 'q': case 'Q': return false;
    case 's': u->sort = (u->sort + 1) % SORT_COUNT; break;
    case 'r': u->reverse = !u->reverse; break;
    case 'f': case '/': u->editing = true; u->edit[0] = '\0'; break;
    case 'd': u->device = u->s.ndevices ? (u->device + 1) % u->s.ndevices : 0; break;
    case 'w': u->window = (u->window + 1) % NWINDOWS; break;
    case 'p': u->paused = !u->paused; break;
    case 'h': case '?': u->help = !u->help; break;
    default: break;
    }
    return true;
}

static void take_sample(ui *u, gm__sampler *smp) {
    gm__mon_sample s;
    uint64_t seq;
    if (gm__sampler_latest(smp, &s, &seq, 0, 0) != 0) return;
    if (seq == u->seq) {
        gm__sample_free(&s);
        return;
    }
    u->seq = seq;
    for (int d = 0; d < s.ndevices && d < GM_MAX_DEVICES; d++) hist_add(&u->hist[d], &s, d);
    if (u->paused) {
        gm__sample_free(&s);
        return;
    }
    gm__sample_free(&u->s);
    u->s = s;
    if (u->device >= u->s.ndevices) u->device = 0;
}

int cmd_top(int argc, char **argv) {
    static ui u; /* large: keep it off the stack */
    memset(&u, 0, sizeof u);
    u.interval = 0.5;
    u.window = 1;
    bool nvml = true, all = false;
    int rc = parse_args(argc, argv, &u.interval, &nvml, &all);
    if (rc >= 0) return rc;
    /* A live view needs a terminal; say what to use instead of writing escape codes into a pipe. */
    if (!isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO))
        return cli_usage_error(argv[0], "needs a terminal; for a pipe or a file use 'gpumem smi' "
                                        "(one sample) or 'gpumem log' (periodic)");
    const char *term = getenv("TERM");
    if (!term || !*term)
        return cli_usage_error(argv[0], "TERM is not set, so the terminal type is unknown; set it "
                                        "(e.g. TERM=xterm-256color) or use 'gpumem smi'");
    SCREEN *scr = newterm(NULL, stdout, stdin);
    if (!scr)
        return cli_usage_error(argv[0], "terminal type '%s' is unknown to ncurses; try "
                                        "TERM=xterm-256color or use 'gpumem smi'", term);
    gm__collector *c;
    gm__sampler *smp;
    if (gm__collector_create(&c, NULL, nvml) != 0) return cli_error(argv[0], "out of memory");
    gm__collector_all_users(c, all);
    if (gm__sampler_start(&smp, c, u.interval) != 0) {
        gm__collector_destroy(c);
        return cli_error(argv[0], "cannot start the sampler thread");
    }
    set_term(scr);
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    timeout(100); /* redraw at most 10 times a second, keys at once */
    set_escdelay(25);
    for (;;) {
        take_sample(&u, smp);
        draw(&u);
        int ch = getch();
        if (ch != ERR && !key(&u, ch)) break;
    }
    endwin();
    delscreen(scr);
    gm__sampler_stop(smp);
    gm__collector_destroy(c);
    gm__sample_free(&u.s);
    for (int d = 0; d < GM_MAX_DEVICES; d++) free(u.hist[d].p);
    return 0;
}
#endif
