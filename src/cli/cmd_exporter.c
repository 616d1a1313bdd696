/* cmd_exporter.c — `gpumem exporter`: serve GPU and allocator memory in the
 * Prometheus text format 0.0.4 over HTTP (libmicrohttpd). A sampler thread
 * samples every --interval; a scrape is answered from the latest sample, so
 * scrapes cost no NVML calls and never wait on a slow sample. Listens on
 * loopback unless told otherwise: the metrics name processes and jobs. */
#include "cli.h"

#include "monitor/monitor.h"
#include "util/gm_limits.h"

#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The default address: loopback, and a port of our own. 9400 is
 * dcgm-exporter's on every GPU Operator node; Prometheus's list of exporter
 * ports (its wiki, "Default port allocations") has been full from 9100 to
 * 9999 since 2023, new exporters getting 10000 and up in order; 10400 lies
 * well past those, clear of Kubernetes' 10248-10260 (docs/monitoring.md). */
#define GM_EXPORTER_LISTEN "127.0.0.1:10400"

/* Parses the exporter's options; returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, const char **listen, double *interval, bool *nvml, bool *all) {
    bool no_nvml = false, node = false;
    const struct cli_opt opts[] = {
        {"listen", 0, CLI_STR, listen, "ADDR:PORT", "address to serve on; port 0 picks a free port",
         GM_EXPORTER_LISTEN, 0, 0},
        CLI_OPT_INTERVAL(interval, "1"),
        CLI_OPT_NO_NVML(&no_nvml),
        CLI_OPT_ALL_USERS(all),
        {"node", 0, CLI_FLAG, &node, NULL, "the node agent: --all-users (one exporter per node)", NULL, 0, 0},
    };
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "", .opts = opts, .nopts = CLI_NOPTS(opts),
        .about = "Serves /metrics for Prometheus (loopback by default: the metrics name processes\n"
                 "and jobs). The address served is printed on stdout.",
    };
    int rc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return cli_parse_exit(rc);
    *nvml = !no_nvml;
    *all = *all || node;
    return -1;
}

#ifndef GM_HAVE_MHD
int cmd_exporter(int argc, char **argv) {
    const char *listen = GM_EXPORTER_LISTEN;
    double interval = 1.0;
    bool nvml = true, all = false;
    int rc = parse_args(argc, argv, &listen, &interval, &nvml, &all);
    if (rc >= 0) return rc;
    return cli_error(argv[0], "this gpumem was built without libmicrohttpd (install libmicrohttpd-dev and rebuild)");
}
#else
#include <arpa/inet.h>
#include <microhttpd.h>
#include <sys/socket.h>
#include <netinet/in.h>

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

/* ---- a deadline for the whole request ----------------------------------------
 * MHD's timeout is for idleness, and a client that trickles a header byte
 * every few seconds is never idle. Each connection is tracked from its
 * start (or the end of its last request); a reaper shuts down the socket
 * of any whose request has taken longer than the deadline, and MHD then
 * closes it. Entries leave the list in MHD's CLOSED notification, which
 * comes before MHD closes the socket, under the same mutex as the reaper:
 * the reaper never touches a closed (or reused) descriptor.
 *
 * ---- room for a scraper however many slow clients wait
 * A fixed limit that refuses new connections once slow clients hold every
 * place locks scrapers out (32 slow connections from one address starved
 * that address's scraper; 288 over nine addresses starved everyone:
 * bench/RESULTS.md, "monitor defects", tests/cli/exporter_slow_clients.sh).
 * So the limits are ours, enforced when a connection arrives (MHD's accept
 * policy): when its address already holds GM_LIMIT_HTTP_CONNECTIONS_PER_IP
 * connections, or all of them hold GM_LIMIT_HTTP_CONNECTIONS, the one
 * waiting longest (since its start or its last answer) is cut to make room.
 * A scrape is answered within milliseconds of arriving; only a flood of new
 * connections, not slow ones, can push it out first. MHD's own limit is set
 * above ours (cut sockets close on MHD's next turn) and bounds the whole. */
typedef struct tracked {
    struct tracked *prev, *next;
    int fd;
    double since;
    bool cut;
    struct in_addr ip;
} tracked;

static pthread_mutex_t conn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reaper_cv;
static tracked *conns;
static bool reaper_stop;
static double request_deadline_s = GM_LIMIT_HTTP_REQUEST_S;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        tracked *t = calloc(1, sizeof *t);
        if (!t || !ci) {
            free(t);
            return;
        }
        t->fd = ci->connect_fd;
        t->since = mono_s();
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ai && ai->client_addr && ai->client_addr->sa_family == AF_INET)
            t->ip = ((const struct sockaddr_in *)ai->client_addr)->sin_addr;
        pthread_mutex_lock(&conn_mu);
        t->next = conns;
        if (conns) conns->prev = t;
        conns = t;
        pthread_mutex_unlock(&conn_mu);
        *socket_context = t;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        tracked *t = *socket_context;
        pthread_mutex_lock(&conn_mu);
        if (t->prev) t->prev->next = t->next;
        else conns = t->next;
        if (t->next) t->next->prev = t->prev;
        pthread_mutex_unlock(&conn_mu);
        free(t);
        *socket_context = NULL;
    }
}

/* A request answered: the next one on this connection gets its own time. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)con_cls;
    (void)toe;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (!ci || !ci->socket_context) return;
    pthread_mutex_lock(&conn_mu);
    ((tracked *)ci->socket_context)->since = mono_s();
    pthread_mutex_unlock(&conn_mu);
}

/* Cut the live connection (from `ip`, or any when ip is NULL) waiting
 * longest; conn_mu held. */
static void evict_oldest(const struct in_addr *ip) {
    tracked *old = NULL;
    for (tracked *t = conns; t; t = t->next)
        if (!t->cut && (!ip || t->ip.s_addr == ip->s_addr) && (!old || t->since < old->since)) old = t;
    if (old) {
        shutdown(old->fd, SHUT_RDWR); /* MHD sees the end and closes it */
        old->cut = true;
    }
}

/* MHD's accept policy: always admit, making room first (see above). */
static enum MHD_Result admit(void *cls, const struct sockaddr *addr, socklen_t len) {
    (void)cls;
    const struct in_addr *ip =
        addr && len >= (socklen_t)sizeof(struct sockaddr_in) && addr->sa_family == AF_INET
            ? &((const struct sockaddr_in *)addr)->sin_addr : NULL;
    pthread_mutex_lock(&conn_mu);
    int all = 0, same = 0;
    for (tracked *t = conns; t; t = t->next)
        if (!t->cut) {
            all++;
            same += ip && t->ip.s_addr == ip->s_addr;
        }
    if (ip && same >= GM_LIMIT_HTTP_CONNECTIONS_PER_IP) evict_oldest(ip);
    else if (all >= GM_LIMIT_HTTP_CONNECTIONS) evict_oldest(NULL);
    pthread_mutex_unlock(&conn_mu);
    return MHD_YES;
}

static void *reaper_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&conn_mu);
    while (!reaper_stop) {
        double now = mono_s();
        for (tracked *t = conns; t; t = t->next)
            if (!t->cut && now - t->since > request_deadline_s) {
                shutdown(t->fd, SHUT_RDWR); /* MHD sees the end and closes it */
                t->cut = true;
            }
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += 250000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&reaper_cv, &conn_mu, &dl);
    }
    pthread_mutex_unlock(&conn_mu);
    return NULL;
}

/* MHD's own unescaping would turn "/metrics%00" into "/metrics" (cut at
 * the NUL) and serve it; ours leaves %00 escaped: no page matches (404). */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    return gm__http_unescape(s);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    gm__sampler *sampler = cls;
    int page = gm__http_route(method, url);
    if (page == GM_HTTP_BAD_METHOD) return reply(conn, 405, "text/plain", strdup("only GET\n"), 9);
    if (page == GM_HTTP_INDEX) {
        const char *html = "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n";
        return reply(conn, 200, "text/html", strdup(html), strlen(html));
    }
    if (page != GM_HTTP_METRICS) return reply(conn, 404, "text/plain", strdup("not found\n"), 10);
    gm__mon_sample s;
    /* before the first sample, wait for it rather than answer empty */
    if (gm__sampler_latest(sampler, &s, NULL, 0, 5.0) != 0)
        return reply(conn, 503, "text/plain", strdup("no sample yet\n"), 14);
    gm__sbuf b = {0};
    gm__format_prometheus(&s, &b);
    gm__sample_free(&s);
    if (b.oom) {
        gm__sbuf_free(&b);
        return reply(conn, 500, "text/plain", strdup("out of memory\n"), 14);
    }
    return reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
}

static bool parse_listen(const char *s, struct sockaddr_in *sa) {
    const char *colon = strrchr(s, ':');
    if (!colon) return false;
    char host[64];
    size_t hl = (size_t)(colon - s);
    if (hl >= sizeof host) return false;
    memcpy(host, s, hl);
    host[hl] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port < 0 || port > 65535) return false;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) strcpy(host, "127.0.0.1");
    if (!host[0]) strcpy(host, "0.0.0.0");
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

/* The HTTP library's messages, under gpumem's name, at most LOG_BURST in a
 * LOG_WINDOW_S window: it writes a line for every connection cut (a client
 * gone, one cut for the connection limits), so slow clients could fill
 * stderr as fast as they connect (tests/cli/exporter_log_flood.sh). The
 * rest are counted, and the count is said when the next window opens and at
 * exit. */
enum { LOG_BURST = 10, LOG_WINDOW_S = 60 };
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static double log_window = -1e9; /* when the current window opened */
static unsigned log_shown;
static unsigned long long log_hidden;

static void log_flush_locked(void) {
    if (log_hidden)
        fprintf(stderr, "gpumem exporter: libmicrohttpd: %llu more message%s not shown (at most %d per %d s)\n",
                log_hidden, log_hidden == 1 ? "" : "s", LOG_BURST, LOG_WINDOW_S);
    log_hidden = 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    pthread_mutex_lock(&log_mu);
    double now = mono_s();
    if (now - log_window >= LOG_WINDOW_S) {
        log_flush_locked();
        log_window = now;
        log_shown = 0;
    }
    if (log_shown < LOG_BURST) {
        log_shown++;
        fprintf(stderr, "gpumem exporter: libmicrohttpd: ");
        vfprintf(stderr, fmt, ap);
    } else {
        log_hidden++;
    }
    pthread_mutex_unlock(&log_mu);
}

/* Can this process listen on sa? false with the reason ("Address already in
 * use: ...") when it cannot. */
static bool can_bind(const struct sockaddr_in *sa, char *why, size_t len) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, len, "socket: %s", strerror(errno));
        return false;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool ok = bind(fd, (const struct sockaddr *)sa, sizeof *sa) == 0;
    if (!ok) {
        int e = errno;
        snprintf(why, len, "%s%s", strerror(e),
                 e == EADDRINUSE ? " (another exporter? pick a port with --listen ADDR:PORT, or port 0 for a free one)"
                 : e == EADDRNOTAVAIL ? " (no interface has that address)"
                                      : "");
    }
    close(fd);
    return ok;
}

int cmd_exporter(int argc, char **argv) {
    const char *listen = GM_EXPORTER_LISTEN;
    double interval = 1.0;
    bool nvml = true, all = false;
    int prc = parse_args(argc, argv, &listen, &interval, &nvml, &all);
    if (prc >= 0) return prc;
    struct sockaddr_in sa;
    if (!parse_listen(listen, &sa))
        return cli_usage_error(argv[0], "--listen wants IPV4ADDR:PORT (e.g. " GM_EXPORTER_LISTEN "), not '%s'", listen);
    /* Say why the address cannot be used in our own words, before the HTTP
     * library (whose message names "port 0" when given an address) does. */
    char why[160];
    if (!can_bind(&sa, why, sizeof why)) return cli_error(argv[0], "cannot listen on %s: %s", listen, why);
    /* block the stop signals before any thread starts, so only the main
     * thread (in sigsuspend) takes them: no lost wake-up */
    sigset_t stopset, oldset;
    sigemptyset(&stopset);
    sigaddset(&stopset, SIGINT);
    sigaddset(&stopset, SIGTERM);
    struct sigaction act = {.sa_handler = on_signal};
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_BLOCK, &stopset, &oldset);
    gm__collector *c;
    gm__sampler *sampler;
    if (gm__collector_create(&c, NULL, nvml) != 0) return cli_error(argv[0], "out of memory");
    gm__collector_all_users(c, all);
    if (gm__sampler_start(&sampler, c, interval) != 0) {
        gm__collector_destroy(c);
        return cli_error(argv[0], "cannot start the sampler thread");
    }
    /* epoll (no FD_SETSIZE wall at 1024 connections, where select() locked
     * every scraper out), bounded connections overall and per address (ours,
     * making room for new ones: admit), an idle timeout, and no more memory
     * per connection than a scrape needs */
    /* GPUMEM_EXPORTER_REQUEST_S shortens the deadline (tests only) */
    const char *rq = getenv("GPUMEM_EXPORTER_REQUEST_S");
    if (rq && atof(rq) > 0 && atof(rq) < request_deadline_s) request_deadline_s = atof(rq);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&reaper_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t reaper;
    bool have_reaper = pthread_create(&reaper, NULL, reaper_main, NULL) == 0;
    unsigned flags = MHD_USE_ERROR_LOG | MHD_USE_INTERNAL_POLLING_THREAD;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    /* the logger first: MHD warns about (and logs with its own logger) any
     * option before it */
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, admit, NULL, handle, sampler, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * GM_LIMIT_HTTP_CONNECTIONS),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)GM_LIMIT_HTTP_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)16384, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        NULL, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    int code = 0;
    if (!d) code = cli_error(argv[0], "cannot listen on %s (address in use or not available?)", listen);
    else {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        char host[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
        printf("gpumem exporter: serving http://%s:%u/metrics\n", host,
               info ? (unsigned)info->port : (unsigned)ntohs(sa.sin_port));
        fflush(stdout);
        while (!stop_requested) sigsuspend(&oldset);
    }
    /* stop the sampler first: scrapes waiting for a sample return at once,
     * so MHD stops at once; a sampler stuck inside a sample (a hung NVML
     * call) is left behind rather than holding SIGTERM up */
    bool stopped = gm__sampler_stop_within(sampler, 1.0);
    if (d) MHD_stop_daemon(d);
    if (have_reaper) {
        pthread_mutex_lock(&conn_mu);
        reaper_stop = true;
        pthread_cond_signal(&reaper_cv);
        pthread_mutex_unlock(&conn_mu);
        pthread_join(reaper, NULL);
    }
    pthread_mutex_lock(&log_mu);
    log_flush_locked();
    pthread_mutex_unlock(&log_mu);
    if (stopped) gm__collector_destroy(c);
    else fprintf(stderr, "gpumem exporter: the sampler did not stop within 1 s; exiting anyway\n");
    return code;
}
#endif
