/* fake_nvml.c — a stand-in libnvidia-ml.so.1 for the CLI tests on a machine
 * without a GPU: one device, and the compute processes listed in
 * $GPUMEM_FAKE_NVML_PROCS ("pid:used_bytes,..."), the way a driver that does
 * not translate PIDs lists them: in the initial PID namespace, whoever asks.
 * A test puts its folder on LD_LIBRARY_PATH; gpumem's dlopen finds it as it
 * would find the driver's. Only the entry points nvml.c needs for that. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK 0
#define INVALID_ARGUMENT 2
#define INSUFFICIENT_SIZE 7
#define MAX_PROCS 64

int nvmlInit_v2(void) { return OK; }
int nvmlShutdown(void) { return OK; }
int nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    snprintf(buf, len, "550.54.15");
    return OK;
}
int nvmlDeviceGetCount_v2(unsigned *count) {
    *count = 1;
    return OK;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **dev) {
    if (index != 0) return INVALID_ARGUMENT;
    *dev = (void *)(uintptr_t)1;
    return OK;
}
int nvmlDeviceGetName(void *dev, char *buf, unsigned len) {
    snprintf(buf, len, "Fake NVML GPU");
    return OK;
}

/* nvmlProcessInfo_t (v3 call, 24 bytes): pid, pad, usedGpuMemory, two ids */
int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned *count, void *infos) {
    unsigned pid[MAX_PROCS];
    unsigned long long used[MAX_PROCS];
    unsigned n = 0;
    const char *s = getenv("GPUMEM_FAKE_NVML_PROCS");
    while (s && *s && n < MAX_PROCS) {
        char *end;
        pid[n] = (unsigned)strtoul(s, &end, 10);
        if (*end != ':') break;
        used[n++] = strtoull(end + 1, &end, 10);
        s = *end == ',' ? end + 1 : end;
    }
    if (*count < n) {
        *count = n;
        return INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        unsigned char *r = (unsigned char *)infos + (size_t)i * 24;
        memset(r, 0xff, 24);
        memcpy(r, &pid[i], 4);
        memcpy(r + 8, &used[i], 8);
    }
    *count = n;
    return OK;
}
