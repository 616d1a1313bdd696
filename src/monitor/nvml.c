/* nvml.c — NVML loaded with dlopen("libnvidia-ml.so.1") into a table of
 * function pointers that tests replace with a fake. Nothing links against
 * the driver, so the monitor runs (allocator data only) where it is absent.
 *
 * Two driver differences are handled here:
 *  - nvmlDeviceGetMemoryInfo_v2 (with version 0x02000028) reports the
 *    driver-reserved bytes, so total = reserved + used + free; older drivers
 *    only have v1, where reserved is counted in used. We fall back and say so.
 *  - the per-process record of nvmlDeviceGetComputeRunningProcesses_v3 is
 *    24 bytes, except on drivers 535.43-535.86 whose header had an extra
 *    8-byte field (32 bytes). */
#include "internal.h"
#include "monitor/monitor.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7

struct gm__nvml {
    gm__nvml_fns f;
    void *dl; /* NULL with a test table */
    bool mem_v1;
    int proc_record_size;
};

/* nvmlMemory_v2_t and nvmlMemory_t */
typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} nvml_memory_v2;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory_v1;
typedef struct {
    unsigned gpu, memory;
} nvml_util;
/* nvmlPciInfo_t: busIdLegacy[16], five unsigned, busId[32] */
#define PCI_INFO_BUSID_OFFSET 36
#define PCI_INFO_SIZE 68

_Static_assert(sizeof(nvml_memory_v2) == 40, "nvmlMemory_v2_t layout");

static int record_size_for(const char *driver) {
    unsigned major = 0, minor = 0;
    if (sscanf(driver, "%u.%u", &major, &minor) == 2 && major == 535 && minor >= 43 && minor <= 86)
        return 32;
    return 24;
}

static int load(gm__nvml *n, char *why, size_t whylen) {
    n->dl = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n->dl) {
        const char *e = dlerror();
        snprintf(why, whylen, "NVML absent (%s): showing allocator data only", e ? e : "libnvidia-ml.so.1 not found");
        return GM_ENODRIVER;
    }
#define SYM(field, name) *(void **)&n->f.field = dlsym(n->dl, name)
    SYM(init, "nvmlInit_v2");
    SYM(shutdown, "nvmlShutdown");
    SYM(driver_version, "nvmlSystemGetDriverVersion");
    SYM(device_count, "nvmlDeviceGetCount_v2");
    SYM(device_handle, "nvmlDeviceGetHandleByIndex_v2");
    SYM(device_name, "nvmlDeviceGetName");
    SYM(device_uuid, "nvmlDeviceGetUUID");
    SYM(device_pci, "nvmlDeviceGetPciInfo_v3");
    SYM(memory_v2, "nvmlDeviceGetMemoryInfo_v2");
    SYM(memory_v1, "nvmlDeviceGetMemoryInfo");
    SYM(utilization, "nvmlDeviceGetUtilizationRates");
    SYM(procs_v3, "nvmlDeviceGetComputeRunningProcesses_v3");
    SYM(procs_v1, "nvmlDeviceGetComputeRunningProcesses");
#undef SYM
    return GM_OK;
}

int gm__nvml_open(gm__nvml **out, const gm__nvml_fns *fns, char *why, size_t whylen) {
    *out = NULL;
    if (whylen) why[0] = '\0';
    gm__nvml *n = calloc(1, sizeof *n);
    if (!n) return GM_ENOHOSTMEM;
    int rc = GM_OK;
    if (fns) n->f = *fns;
    else rc = load(n, why, whylen);
    if (rc == GM_OK && (!n->f.init || !n->f.device_count || !n->f.device_handle)) {
        snprintf(why, whylen, "NVML unusable: nvmlInit_v2/nvmlDeviceGetCount_v2/nvmlDeviceGetHandleByIndex_v2 missing");
        rc = GM_ENODRIVER;
    }
    if (rc == GM_OK) {
        int r = n->f.init();
        if (r != NVML_SUCCESS) {
            snprintf(why, whylen, "NVML present but nvmlInit_v2 failed (error %d): showing allocator data only", r);
            rc = GM_ENODRIVER;
        }
    }
    if (rc != GM_OK) {
        if (n->dl) dlclose(n->dl);
        free(n);
        return rc;
    }
    char driver[96] = "";
    if (n->f.driver_version) n->f.driver_version(driver, sizeof driver);
    n->proc_record_size = record_size_for(driver);
    *out = n;
    return GM_OK;
}

void gm__nvml_close(gm__nvml *n) {
    if (!n) return;
    if (n->f.shutdown) n->f.shutdown();
    if (n->dl) dlclose(n->dl);
    free(n);
}

int gm__nvml_device_count(gm__nvml *n, int *count) {
    unsigned c = 0;
    if (n->f.device_count(&c) != NVML_SUCCESS) return GM_EBACKEND;
    *count = c > GM_MAX_DEVICES ? GM_MAX_DEVICES : (int)c;
    return GM_OK;
}

static void device_memory(gm__nvml *n, void *dev, gm__mon_dev *out) {
    if (!n->mem_v1 && n->f.memory_v2) {
        nvml_memory_v2 m = {.version = GM__NVML_MEMORY_V2_VERSION};
        if (n->f.memory_v2(dev, &m) == NVML_SUCCESS) {
            out->have_mem = out->have_reserved = true;
            out->total = m.total;
            out->reserved = m.reserved;
            out->used = m.used;
            out->free = m.free;
            return;
        }
    }
    /* v2 missing or refused (older driver): v1 counts reserved inside used */
    if (!n->f.memory_v1) return;
    n->mem_v1 = true;
    nvml_memory_v1 m = {0};
    if (n->f.memory_v1(dev, &m) != NVML_SUCCESS) return;
    out->have_mem = true;
    out->total = m.total;
    out->used = m.used;
    out->free = m.free;
}

int gm__nvml_device(gm__nvml *n, int index, gm__mon_dev *out) {
    memset(out, 0, sizeof *out);
    out->index = index;
    void *dev = NULL;
    if (n->f.device_handle((unsigned)index, &dev) != NVML_SUCCESS) return GM_EDEVICE;
    if (n->f.device_name && n->f.device_name(dev, out->name, sizeof out->name) == NVML_SUCCESS)
        out->have_info = true;
    if (n->f.device_uuid) n->f.device_uuid(dev, out->uuid, sizeof out->uuid);
    if (n->f.device_pci) {
        char pci[256] = {0}; /* larger than nvmlPciInfo_t, in case it grows */
        if (n->f.device_pci(dev, pci) == NVML_SUCCESS)
            snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%.31s", pci + PCI_INFO_BUSID_OFFSET);
    }
    out->name[sizeof out->name - 1] = out->uuid[sizeof out->uuid - 1] = '\0';
    device_memory(n, dev, out);
    nvml_util u;
    if (n->f.utilization && n->f.utilization(dev, &u) == NVML_SUCCESS) {
        out->have_util = true;
        out->util_gpu = u.gpu;
        out->util_mem = u.memory;
    }
    return GM_OK;
}

/* Call a GetComputeRunningProcesses variant, growing the buffer as asked. */
static int query_procs(int (*fn)(void *, unsigned *, void *), void *dev, size_t rec,
                       unsigned char **buf, unsigned *count) {
    unsigned cap = 64;
    for (int attempt = 0; attempt < 4; attempt++) {
        unsigned char *b = calloc(cap, rec);
        if (!b) return GM_ENOHOSTMEM;
        unsigned c = cap;
        int r = fn(dev, &c, b);
        if (r == NVML_SUCCESS) {
            *buf = b;
            *count = c > cap ? cap : c;
            return GM_OK;
        }
        free(b);
        if (r != NVML_ERROR_INSUFFICIENT_SIZE) return GM_EBACKEND;
        cap = c > cap ? c + 16 : cap * 2;
    }
    return GM_EBACKEND;
}

int gm__nvml_processes(gm__nvml *n, int index, gm__nvml_proc **out, int *count) {
    *out = NULL;
    *count = 0;
    void *dev = NULL;
    if (!n->f.procs_v3 && !n->f.procs_v1) return GM_ENOTSUP;
    if (n->f.device_handle((unsigned)index, &dev) != NVML_SUCCESS) return GM_EDEVICE;
    /* v3 records: pid (u32), pad, usedGpuMemory (u64), then ids; v1: pid, pad, used */
    size_t rec = n->f.procs_v3 ? (size_t)n->proc_record_size : 16;
    unsigned char *buf = NULL;
    unsigned c = 0;
    int rc = query_procs(n->f.procs_v3 ? n->f.procs_v3 : n->f.procs_v1, dev, rec, &buf, &c);
    if (rc != GM_OK) return rc;
    gm__nvml_proc *p = calloc(c ? c : 1, sizeof *p);
    if (!p) {
        free(buf);
        return GM_ENOHOSTMEM;
    }
    for (unsigned i = 0; i < c; i++) {
        uint32_t pid;
        uint64_t used;
        memcpy(&pid, buf + i * rec, 4);
        memcpy(&used, buf + i * rec + 8, 8);
        p[i].pid = (int)pid;
        p[i].have_used = used != GM__NVML_NOT_AVAILABLE;
        p[i].used = p[i].have_used ? used : 0;
    }
    free(buf);
    *out = p;
    *count = (int)c;
    return GM_OK;
}

bool gm__nvml_mem_v1_fallback(const gm__nvml *n) { return n->mem_v1; }
int gm__nvml_proc_record_size(const gm__nvml *n) { return n->proc_record_size; }
