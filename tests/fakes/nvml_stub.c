/* A stand-in libnvidia-ml.so.1 for machines without an NVIDIA driver.
 *
 * The real nvidia-ml-py bindings (``import pynvml``) load it through ctypes exactly as
 * they load the driver's library, so everything above the C ABI is the code users run:
 * pynvml's ctypes structs, its error classes, its two-call process query, and the
 * agent's GPU source on top.  It answers from memory with the same values and the same
 * named scenarios as the Python fake (tests/fakes/nvml.py); what it cannot show is the
 * time a real driver spends in the kernel.
 *
 * Configured like the Python fake, from $CMDARE_FAKE_NVML read at nvmlInit:
 *   gpus=N, model=a100|h100|v100|t4|k80|p100,
 *   scenario=healthy|driver_not_loaded|no_gpus|gpu_lost|field_not_supported|xid,
 *   lost_after=N
 * (driver_missing is the real thing here: no library on the loader's path.)
 *
 * Built by tests/fakes/nvml_stub.py: cc -shared -fPIC -O2 -o libnvidia-ml.so.1 nvml_stub.c
 * With -DNVML_STUB_R470 it is a driver older than the binding (the R470 branch, the last
 * for K80s): no nvmlDeviceGetCurrentClocksEventReasons (R535 renamed the throttle-reasons
 * call) and no nvmlDeviceGetComputeRunningProcesses_v3, only _v2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999
};
enum { NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum { NVML_PCIE_UTIL_TX_BYTES = 0 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0 };
#define XID_CRITICAL 8ULL
#define MAX_GPUS 64

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

struct nvmlDevice_st {
    int index;
    char name[96], uuid[96];
    unsigned long long mem_total;
    unsigned int power_limit, sm_max, mem_clk;
    long samples;
    int lost;
    unsigned long long ecc[2];
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct nvmlEventSet_st { int unused; };
typedef struct nvmlEventSet_st *nvmlEventSet_t;

enum { HEALTHY, DRIVER_NOT_LOADED, NO_GPUS, GPU_LOST, FIELD_NOT_SUPPORTED, XID };
static const char *SCENARIOS[] = {"healthy", "driver_not_loaded", "no_gpus", "gpu_lost",
                                  "field_not_supported", "xid"};

/* name, memory total (bytes), power limit (mW), max SM / mem clock (MHz): as the Python fake */
static const struct { const char *key, *name; unsigned long long mem; unsigned int power, sm, memclk; } MODELS[] = {
    {"a100", "NVIDIA A100-SXM4-40GB", 42949672960ULL, 400000, 1410, 1215},
    {"h100", "NVIDIA H100 80GB HBM3", 85520809984ULL, 700000, 1980, 2619},
    {"v100", "Tesla V100-SXM2-16GB", 17179869184ULL, 300000, 1530, 877},
    {"t4", "Tesla T4", 16106127360ULL, 70000, 1590, 5000},
    {"k80", "Tesla K80", 12079136768ULL, 149000, 875, 2505},
    {"p100", "Tesla P100-PCIE-16GB", 17071734784ULL, 250000, 1328, 715},
};

static struct nvmlDevice_st devs[MAX_GPUS];
static int ngpus, scenario, lost_after = 2, inited;
static struct nvmlEventSet_st the_set;
static struct { nvmlDevice_t dev; unsigned long long xid; } pending[16];
static int npending;

static void configure(void) {
    char buf[512], model[16] = "a100";
    const char *env = getenv("CMDARE_FAKE_NVML");
    ngpus = 2, scenario = HEALTHY, lost_after = 2, npending = 0;
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    for (char *kv = strtok(buf, ","); kv; kv = strtok(NULL, ",")) {
        char *v = strchr(kv, '=');
        if (!v) continue;
        *v++ = 0;
        if (!strcmp(kv, "gpus")) ngpus = atoi(v);
        else if (!strcmp(kv, "lost_after")) lost_after = atoi(v);
        else if (!strcmp(kv, "model")) snprintf(model, sizeof model, "%s", v);
        else if (!strcmp(kv, "scenario"))
            for (int i = 0; i < (int)(sizeof SCENARIOS / sizeof *SCENARIOS); i++)
                if (!strcmp(v, SCENARIOS[i])) scenario = i;
    }
    if (ngpus < 0) ngpus = 0;
    if (ngpus > MAX_GPUS) ngpus = MAX_GPUS;
    int m = 0;
    for (int i = 0; i < (int)(sizeof MODELS / sizeof *MODELS); i++)
        if (!strcmp(model, MODELS[i].key)) m = i;
    for (int i = 0; i < ngpus; i++) {
        struct nvmlDevice_st *d = &devs[i];
        memset(d, 0, sizeof *d);
        d->index = i;
        snprintf(d->name, sizeof d->name, "%s", MODELS[m].name);
        snprintf(d->uuid, sizeof d->uuid, "GPU-%08x-fake-4e1f-9a7b-%s%04d", i, MODELS[m].key, i);
        d->mem_total = MODELS[m].mem;
        d->power_limit = MODELS[m].power, d->sm_max = MODELS[m].sm, d->mem_clk = MODELS[m].memclk;
    }
}

/* the checks every per-device query makes (the Python fake's _dev) */
static nvmlReturn_t dev_ok(nvmlDevice_t d, int unsupported) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (d < devs || d >= devs + ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    if (unsupported && scenario == FIELD_NOT_SUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
#define CHECK(d, unsupported) do { nvmlReturn_t r_ = dev_ok(d, unsupported); if (r_) return r_; } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    configure();
    if (scenario == DRIVER_NOT_LOADED) return NVML_ERROR_DRIVER_NOT_LOADED;
    inited++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    inited--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    *count = scenario == NO_GPUS ? 0 : (unsigned int)ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *out) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (i >= (unsigned int)ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *out = &devs[i];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *s, char *buf, unsigned int len) {
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len) {
    CHECK(d, 0);
    return copy_text(d->uuid, buf, len);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len) {
    CHECK(d, 0);
    return copy_text(d->name, buf, len);
}

/* utilisation is the first call of a sample: it advances the device's clock */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (scenario == GPU_LOST && d >= devs && d < devs + ngpus && d->index == 1 && d->samples >= lost_after)
        d->lost = 1; /* falls off the bus after lost_after good samples */
    CHECK(d, 0);
    d->samples++;
    if (scenario == XID && d->samples == 3 && npending < 16) {
        d->ecc[0] += 5;
        pending[npending].dev = d, pending[npending].xid = 79, npending++;
    }
    u->gpu = 90 + (unsigned int)((d->samples + d->index) % 10);
    u->memory = 40 + (unsigned int)(d->samples % 20);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    CHECK(d, 0);
    m->total = d->mem_total, m->used = d->mem_total * 3 / 4, m->free = d->mem_total / 4;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d, 1);
    *mw = d->power_limit * 8 / 10 + (unsigned int)(d->samples * 7 % 5000);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d, 1);
    *mw = d->power_limit;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    (void)sensor;
    CHECK(d, 0);
    *t = 60 + (unsigned int)(d->samples % 15);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    CHECK(d, 0);
    *mhz = type == NVML_CLOCK_SM ? d->sm_max : d->mem_clk;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs) {
    CHECK(d, 1);
    *kbs = counter == NVML_PCIE_UTIL_TX_BYTES ? 1200000 + 1000 * (unsigned int)d->samples : 3400000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *mask) {
    CHECK(d, 0);
    *mask = d->samples % 4 == 0 ? 0x4 : 0; /* sw power cap now and then */
    return NVML_SUCCESS;
}
#ifndef NVML_STUB_R470
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *mask) {
    return nvmlDeviceGetCurrentClocksThrottleReasons(d, mask);
}
#endif

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int etype, int counter, unsigned long long *n) {
    (void)counter;
    CHECK(d, 1);
    *n = d->ecc[etype == NVML_MEMORY_ERROR_TYPE_CORRECTED ? 0 : 1];
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: a count too small gets INSUFFICIENT_SIZE and the count needed
 * (_v2 and _v3 share the struct layout in the bindings) */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    CHECK(d, 1);
    if (*count < 1 || !infos) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = 1;
    infos[0].pid = 4000 + (unsigned int)d->index;
    infos[0].usedGpuMemory = d->mem_total / 2;
    infos[0].gpuInstanceId = infos[0].computeInstanceId = 0xFFFFFFFF;
    return NVML_SUCCESS;
}
#ifndef NVML_STUB_R470
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return nvmlDeviceGetComputeRunningProcesses_v2(d, count, infos);
}
#endif

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    *set = &the_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    (void)types, (void)set;
    CHECK(d, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)set, (void)timeout_ms;
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!npending) return NVML_ERROR_TIMEOUT;
    data->device = pending[0].dev;
    data->eventType = XID_CRITICAL;
    data->eventData = pending[0].xid;
    data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
    memmove(pending, pending + 1, sizeof *pending * (size_t)(--npending));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    (void)set;
    return NVML_SUCCESS;
}
