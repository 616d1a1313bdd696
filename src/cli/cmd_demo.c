/* cmd_demo.c — `gpumem demo`: a synthetic training-like workload driven
 * through libgpumem on the simulated device, published for the monitors, so
 * smi/top/log/exporter can be tried (and tested) without a GPU.
 *
 * Each step looks like a training step: activations allocated layer by
 * layer in the forward pass (sizes jitter per step, like variable sequence
 * lengths), freed in reverse in the backward pass while gradients appear,
 * then an optimizer update with temporaries, then the gradients are dropped.
 * Weights and the optimizer state (two tensors per weight, created on the
 * first step) stay: after every step the allocated bytes are the same, so the
 * steady state has no leak (--leak SIZE keeps SIZE more after every step,
 * one). Each step ends with a step mark (gm_step_mark), and blocks carry
 * their categories, so the monitors' step records move. --oom-every N asks
 * for more than the device has every N steps, which the allocator reports
 * as an OOM. */
#include "cli.h"

#include "gpumem/gpumem.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LAYERS 12
#define PER_LAYER 4

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

typedef struct demo {
    const char *cmd;
    gm_allocator *a;
    int device;
    uint64_t weights;  /* bytes of weights */
    uint64_t act;      /* bytes of activations per layer at full size */
    double step_s;
    long oom_every;
    uint64_t capacity;
    uint64_t leak; /* bytes kept after every step */
    uint32_t rng;
    gm_devptr w[LAYERS * PER_LAYER], opt[2 * LAYERS * PER_LAYER];
    bool have_opt;
    gm_config cfg;
} demo;

static const double layer_shape[PER_LAYER] = {3.0 / 12, 1.0 / 12, 4.0 / 12, 4.0 / 12};

static uint32_t next_rand(demo *d) {
    d->rng = d->rng * 1664525u + 1013904223u;
    return d->rng >> 8;
}

static void nap(double seconds) {
    if (seconds <= 0 || stop_requested) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

static uint64_t weight_size(const demo *d, int i) {
    return (uint64_t)((double)d->weights / LAYERS * layer_shape[i % PER_LAYER]);
}

static int alloc_as(demo *d, uint64_t size, gm_devptr *p, int category) {
    int rc = gm_malloc(d->a, d->device, size, 0, p);
    if (rc == GM_OK && category >= 0) gm_block_set_category(d->a, *p, category);
    if (rc != GM_OK)
        fprintf(stderr, "gpumem demo: allocation of %llu bytes failed: %s\n", (unsigned long long)size,
                gm_strerror(rc));
    return rc;
}
static int alloc(demo *d, uint64_t size, gm_devptr *p) { return alloc_as(d, size, p, -1); }

static int load_weights(demo *d) {
    for (int i = 0; i < LAYERS * PER_LAYER; i++)
        if (alloc_as(d, weight_size(d, i), &d->w[i], GM_CAT_PARAMETERS) != GM_OK) return 1;
    return 0;
}

static int step(demo *d, long n) {
    gm_devptr act[LAYERS * 2], grad[LAYERS * PER_LAYER];
    double pause = d->step_s / (4.0 * LAYERS);
    /* forward: two activation tensors per layer, 50-100% of the full size */
    double jitter = 0.5 + (double)(next_rand(d) % 1000) / 2000.0;
    for (int l = 0; l < LAYERS; l++) {
        uint64_t sz = (uint64_t)((double)d->act * jitter) + 4096 * (uint64_t)l + 512;
        if (alloc_as(d, sz, &act[2 * l], GM_CAT_ACTIVATIONS) != GM_OK ||
            alloc_as(d, sz / 3 + 100, &act[2 * l + 1], GM_CAT_ACTIVATIONS) != GM_OK)
            return 1;
        nap(pause);
    }
    if (d->oom_every > 0 && n % d->oom_every == d->oom_every - 1) {
        gm_devptr p;
        if (gm_malloc(d->a, d->device, d->capacity, 0, &p) == GM_OK) gm_free(d->a, p);
    }
    /* backward: activations go, gradients come */
    for (int l = LAYERS - 1; l >= 0; l--) {
        for (int k = 0; k < PER_LAYER; k++)
            if (alloc_as(d, weight_size(d, l * PER_LAYER + k), &grad[l * PER_LAYER + k], GM_CAT_GRADIENTS) != GM_OK)
                return 1;
        gm_free(d->a, act[2 * l + 1]);
        gm_free(d->a, act[2 * l]);
        nap(pause);
    }
    /* optimizer: Adam's two moments on first use, a temporary per tensor */
    for (int i = 0; i < LAYERS * PER_LAYER; i++) {
        if (!d->have_opt && (alloc_as(d, weight_size(d, i), &d->opt[2 * i], GM_CAT_OPTIMIZER) != GM_OK ||
                             alloc_as(d, weight_size(d, i), &d->opt[2 * i + 1], GM_CAT_OPTIMIZER) != GM_OK))
            return 1;
        gm_devptr tmp;
        if (alloc(d, weight_size(d, i), &tmp) != GM_OK) return 1;
        gm_free(d->a, tmp);
    }
    d->have_opt = true;
    nap(pause * LAYERS);
    for (int i = 0; i < LAYERS * PER_LAYER; i++) gm_free(d->a, grad[i]); /* zero_grad(set_to_none) */
    gm_devptr kept; /* never freed here: gm_allocator_destroy gives it back */
    if (d->leak && alloc_as(d, d->leak, &kept, GM_CAT_OTHER) != GM_OK) return 1;
    gm_step_mark(d->a, d->device);
    nap(pause * LAYERS);
    return 0;
}

/* What the demo published, as one JSON line, for tests and curious users. */
static void report(demo *d, const char *label) {
    gm_stats s = {.size = sizeof s};
    if (gm_get_stats(d->a, d->device, &s) != GM_OK) return;
    printf("{\"pid\":%d,\"gpu\":%d,\"policy\":\"%s\",\"label_length\":%zu,\"allocated\":%lld,\"reserved\":%lld,\"requested\":%lld,"
           "\"peak_allocated\":%lld,\"peak_reserved\":%lld,\"num_ooms\":%lld,\"num_alloc_retries\":%lld}\n",
           (int)getpid(), d->device, gm_policy_name((int)d->cfg.policy), strlen(label),
           (long long)s.allocated_bytes[0].current,
           (long long)s.reserved_bytes[0].current, (long long)s.requested_bytes[0].current,
           (long long)s.allocated_bytes[0].peak, (long long)s.reserved_bytes[0].peak, (long long)s.num_ooms,
           (long long)s.num_alloc_retries);
    fflush(stdout);
}

static bool parse_args(int argc, char **argv, demo *d, double *duration, long long *steps, double *hold,
                       const char **label, int *code) {
    const char *conf = "";
    long long device = 0, oom_every = 0, seed = 0;
    double step_ms = d->step_s * 1000.0;
    const struct cli_opt opts[] = {
        {"duration", 0, CLI_DOUBLE, duration, "SEC", "stop after SEC seconds (default: until interrupted)",
         NULL, 0.001, 1e9},
        CLI_OPT_DEVICE(&device),
        {"capacity", 0, CLI_SIZE, &d->capacity, "SIZE", "memory of the simulated GPU, with a unit",
         "16GiB", CLI_CAPACITY_MIN, CLI_CAPACITY_MAX},
        {"model", 0, CLI_SIZE, &d->weights, "SIZE", "bytes of weights", "1GiB", 1048576, CLI_CAPACITY_MAX},
        {"step-ms", 0, CLI_DOUBLE, &step_ms, "MS", "pause per step", "200", 0, 3.6e6},
        {"steps", 0, CLI_INT, steps, "N",
         "stop training after N steps, print the published stats as one JSON line and hold them "
         "for --hold SEC or until killed", NULL, 1, 1e12},
        {"hold", 0, CLI_DOUBLE, hold, "SEC", "how long to hold the stats after --steps", "3600", 0, 1e9},
        {"oom-every", 0, CLI_INT, &oom_every, "N", "every N steps ask for more than the device has (an OOM)",
         NULL, 1, 1e12},
        {"leak", 0, CLI_SIZE, &d->leak, "SIZE", "keep SIZE bytes more after every step (a leak to watch)",
         NULL, 1, CLI_CAPACITY_MAX},
        {"label", 0, CLI_STR, label, "NAME", "the process name the monitors show", "gpumem-demo", 0, 0},
        CLI_OPT_CONF(&conf),
        {"seed", 0, CLI_INT, &seed, "N", "vary the workload's sizes", "0: the same run every time", 0, 4294967295.0},
    };
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "", .opts = opts, .nopts = CLI_NOPTS(opts),
        .about = "Synthetic training on a simulated device, published for gpumem smi/top/log/exporter:\n"
                 "run it, then 'gpumem smi' or 'gpumem top' in another terminal. It runs PyTorch's\n"
                 "allocator (policy:torch, modelled) unless --conf names another policy.",
    };
    int rc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) {
        *code = cli_parse_exit(rc);
        return false;
    }
    char err[256];
    if (cli_config_parse(&d->cfg, conf, err, sizeof err) != GM_OK) {
        *code = cli_usage_error(argv[0], "bad --conf: %s", err);
        return false;
    }
    if (device >= GM_MAX_DEVICES) {
        *code = cli_usage_error(argv[0], "--device must be below %d, not %lld", GM_MAX_DEVICES, device);
        return false;
    }
    d->device = (int)device;
    d->oom_every = (long)oom_every;
    d->step_s = step_ms / 1000.0;
    d->rng ^= (uint32_t)seed;
    return true;
}

static int run(demo *d, const char *label, double duration, long long steps, double hold) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (load_weights(d)) return 1;
    for (long long n = 0; !stop_requested && (steps <= 0 || n < steps); n++) {
        if (step(d, n)) return 1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (duration > 0 && (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9 >= duration)
            break;
    }
    if (steps > 0 && !stop_requested) {
        report(d, label);
        for (double waited = 0; waited < hold && !stop_requested; waited += 0.1) nap(0.1);
    }
    return 0;
}

int cmd_demo(int argc, char **argv) {
    demo d = {.cmd = argv[0], .capacity = 16ull << 30, .weights = 1ull << 30, .step_s = 0.2, .rng = 12345};
    double duration = 0, hold = 3600;
    long long steps = 0;
    const char *label = "gpumem-demo";
    int code = 0;
    gm_config_init(&d.cfg);
    if (!parse_args(argc, argv, &d, &duration, &steps, &hold, &label, &code)) return code;
    d.act = d.weights / 8;

    gm_sim_options so;
    gm_sim_options_init(&so);
    so.device_count = d.device + 1;
    so.capacity = d.capacity;
    gm_backend *b = NULL;
    int rc = gm_sim_create(&b, &so);
    if (rc == GM_OK) rc = gm_allocator_create(&d.a, b, &d.cfg);
    if (rc == GM_OK) rc = gm_allocator_publish(d.a, label);
    if (rc != GM_OK) {
        code = cli_error(argv[0], "cannot start: %s (%s)", gm_strerror(rc), gm_last_error_detail());
    } else {
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        fprintf(stderr,
                "gpumem demo: pid %d publishing as '%s' on simulated device %d under policy:%s%s; now run "
                "'gpumem smi' or 'gpumem top' in another terminal (Ctrl-C stops the demo)\n",
                (int)getpid(), label, d.device, gm_policy_name((int)d.cfg.policy),
                d.cfg.policy == GM_POLICY_TORCH ? " (PyTorch's allocator, modelled; --conf policy:gpumem for gpumem's)"
                                                : "");
        code = run(&d, label, duration, steps, hold);
    }
    if (d.a) gm_allocator_destroy(d.a); /* unpublishes */
    if (b) gm_backend_destroy(b);
    return code;
}
