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
 *   scenario=healthy|driver_not_loaded|no_gpus|gpu_lost|field_not_supported|xid|
 *            no_tensor|nvlink_errors|row_remap|retired_pages,
 *   lost_after=N, nvlinks=N (active NVLinks per GPU), mig=N (MIG instances per GPU; A100/H100)
 * GPM (profiling metrics) answers on Hopper (h100) only, as on real parts; process
 * utilisation answers NOT_FOUND until a GPU has two samples (no samples yet).
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
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
};
enum { NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum { NVML_PCIE_UTIL_TX_BYTES = 0 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0 };
#define XID_CRITICAL 8ULL
#define MAX_GPUS 64
#define MAX_MIG 7
#define MAX_LINKS 18

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

struct nvmlDevice_st {
    int index, mig_slot, gi, ci; /* mig_slot >= 0: a MIG instance of devs[index] */
    char name[96], uuid[96];
    unsigned long long mem_total;
    unsigned int power_limit, sm_max, mem_clk;
    long samples;
    int lost;
    unsigned long long ecc[2];
    unsigned int sms; /* multiprocessors */
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct nvmlEventSet_st { int unused; };
typedef struct nvmlEventSet_st *nvmlEventSet_t;

enum { HEALTHY, DRIVER_NOT_LOADED, NO_GPUS, GPU_LOST, FIELD_NOT_SUPPORTED, XID, NO_TENSOR, NVLINK_ERRORS, ROW_REMAP,
       RETIRED_PAGES };
static const char *SCENARIOS[] = {"healthy", "driver_not_loaded", "no_gpus", "gpu_lost",
                                  "field_not_supported", "xid", "no_tensor", "nvlink_errors", "row_remap",
                                  "retired_pages"};

/* name, memory total (bytes), power limit (mW), max SM / mem clock (MHz), SMs, generation
 * (what answers: 0 Kepler/Pascal, 1 Volta/Turing: energy, 2 Ampere: + row remapping, MIG,
 * 3 Hopper: + GPM): as the Python fake */
static const struct { const char *key, *name; unsigned long long mem; unsigned int power, sm, memclk, sms, gen; } MODELS[] = {
    {"a100", "NVIDIA A100-SXM4-40GB", 42949672960ULL, 400000, 1410, 1215, 108, 2},
    {"h100", "NVIDIA H100 80GB HBM3", 85520809984ULL, 700000, 1980, 2619, 132, 3},
    {"v100", "Tesla V100-SXM2-16GB", 17179869184ULL, 300000, 1530, 877, 80, 1},
    {"t4", "Tesla T4", 16106127360ULL, 70000, 1590, 5000, 40, 1},
    {"k80", "Tesla K80", 12079136768ULL, 149000, 875, 2505, 13, 0},
    {"p100", "Tesla P100-PCIE-16GB", 17071734784ULL, 250000, 1328, 715, 56, 0},
};

static struct nvmlDevice_st devs[MAX_GPUS], migs[MAX_GPUS][MAX_MIG];
static int ngpus, scenario, lost_after = 2, inited, nvlinks, nmig, gen, kepler;
static struct nvmlEventSet_st the_set;
static struct { nvmlDevice_t dev; unsigned long long xid; } pending[16];
static int npending;

static void configure(void) {
    char buf[512], model[16] = "a100";
    const char *env = getenv("CMDARE_FAKE_NVML");
    ngpus = 2, scenario = HEALTHY, lost_after = 2, npending = 0, nvlinks = 0, nmig = 0;
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    for (char *kv = strtok(buf, ","); kv; kv = strtok(NULL, ",")) {
        char *v = strchr(kv, '=');
        if (!v) continue;
        *v++ = 0;
        if (!strcmp(kv, "gpus")) ngpus = atoi(v);
        else if (!strcmp(kv, "lost_after")) lost_after = atoi(v);
        else if (!strcmp(kv, "nvlinks")) nvlinks = atoi(v);
        else if (!strcmp(kv, "mig")) nmig = atoi(v);
        else if (!strcmp(kv, "model")) snprintf(model, sizeof model, "%s", v);
        else if (!strcmp(kv, "scenario"))
            for (int i = 0; i < (int)(sizeof SCENARIOS / sizeof *SCENARIOS); i++)
                if (!strcmp(v, SCENARIOS[i])) scenario = i;
    }
    if (ngpus < 0) ngpus = 0;
    if (ngpus > MAX_GPUS) ngpus = MAX_GPUS;
    if (nvlinks < 0) nvlinks = 0;
    if (nvlinks > MAX_LINKS) nvlinks = MAX_LINKS;
    if (nmig < 0) nmig = 0;
    if (nmig > MAX_MIG) nmig = MAX_MIG;
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
        d->sms = MODELS[m].sms, d->mig_slot = -1;
        for (int k = 0; k < nmig; k++) { /* 1g.<mem/8> instances: a seventh of the SMs each */
            struct nvmlDevice_st *g = &migs[i][k];
            memset(g, 0, sizeof *g);
            g->index = i, g->mig_slot = k, g->gi = 7 + k, g->ci = 0;
            snprintf(g->name, sizeof g->name, "%s MIG 1g.%llugb", MODELS[m].name, MODELS[m].mem / 8 / 1000000000ULL);
            snprintf(g->uuid, sizeof g->uuid, "MIG-%08x-fake-4e1f-9a7b-%s%04d", i * 16 + k, MODELS[m].key, i);
            g->mem_total = MODELS[m].mem / 8, g->sms = MODELS[m].sms / 7;
        }
    }
    gen = MODELS[m].gen, kepler = !strcmp(MODELS[m].key, "k80");
    if (gen < 2) nmig = 0; /* MIG is Ampere and later */
}

/* the checks every per-device query makes (the Python fake's _dev) */
static int is_mig(nvmlDevice_t d) {
    return d >= &migs[0][0] && d < &migs[0][0] + MAX_GPUS * MAX_MIG && d->index < ngpus && d->mig_slot < nmig;
}
static nvmlReturn_t dev_ok(nvmlDevice_t d, int unsupported) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if ((d < devs || d >= devs + ngpus) && !is_mig(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost || (is_mig(d) && devs[d->index].lost)) return NVML_ERROR_GPU_IS_LOST;
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
    if (is_mig(d) || nmig) return NVML_ERROR_NOT_SUPPORTED; /* no GPU_UTIL in MIG mode */
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
    if (is_mig(d) || nmig) d->samples++; /* MIG mode: memory is a sample's first answer */
    m->total = d->mem_total, m->used = d->mem_total * 3 / 4, m->free = d->mem_total / 4;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d, 1);
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *mw = d->power_limit * 8 / 10 + (unsigned int)(d->samples * 7 % 5000);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d, 1);
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *mw = d->power_limit;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    (void)sensor;
    CHECK(d, 0);
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *t = 60 + (unsigned int)(d->samples % 15);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    CHECK(d, 0);
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *mhz = type == NVML_CLOCK_SM ? d->sm_max : d->mem_clk;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs) {
    CHECK(d, 1);
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *kbs = counter == NVML_PCIE_UTIL_TX_BYTES ? 1200000 + 1000 * (unsigned int)d->samples : 3400000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *mask) {
    CHECK(d, 0);
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
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
    if (is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
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
    infos[0].pid = 4000 + (unsigned int)d->index + (is_mig(d) ? 100 * (unsigned int)(d->mig_slot + 1) : 0);
    infos[0].usedGpuMemory = d->mem_total / 2;
    infos[0].gpuInstanceId = is_mig(d) ? (unsigned int)d->gi : 0xFFFFFFFF;
    infos[0].computeInstanceId = is_mig(d) ? (unsigned int)d->ci : 0xFFFFFFFF;
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

/* ---- issue 38: energy, row remapping, NVLink, per-process utilisation, MIG, GPM ---- */

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    CHECK(d, 1);
    if (gen < 1 || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED; /* Volta and later */
    *mj = 1000000ULL + 300000ULL * (unsigned long long)d->samples; /* 300 J a sample */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    CHECK(d, 1);
    if (gen < 2 || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED; /* Ampere and later */
    int bad = scenario == ROW_REMAP && d->samples >= 2;
    *corr = 0, *unc = bad ? 1 : 0, *pending = bad ? 1 : 0, *failure = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    CHECK(d, 0);
    if (is_mig(d) || !nvlinks) return NVML_ERROR_NOT_SUPPORTED; /* a VM's single GPU: no NVLink */
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *active = link < (unsigned int)nvlinks;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter, unsigned long long *n) {
    CHECK(d, 0);
    if (is_mig(d) || !nvlinks) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)nvlinks || counter < 0 || counter > 4) return NVML_ERROR_INVALID_ARGUMENT;
    /* replay errors (counter 0) grow on link 0 in the nvlink_errors scenario */
    *n = scenario == NVLINK_ERRORS && link == 0 && counter == 0 ? 3ULL * (unsigned long long)d->samples : 0;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                                             unsigned int *count, unsigned long long lastSeen) {
    CHECK(d, 1);
    if (is_mig(d) || kepler) return NVML_ERROR_NOT_SUPPORTED; /* Maxwell and later */
    unsigned long long ts = 1700000000000000ULL + 1000000ULL * (unsigned long long)d->samples; /* us */
    if (d->samples < 2 || lastSeen >= ts) return NVML_ERROR_NOT_FOUND; /* no sample since lastSeen */
    if (!out || *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = 1;
    out[0].pid = 4000 + (unsigned int)d->index;
    out[0].timeStamp = ts;
    out[0].smUtil = 70 + (unsigned int)(d->samples % 10);
    out[0].memUtil = 30 + (unsigned int)(d->samples % 5);
    out[0].encUtil = out[0].decUtil = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    CHECK(d, 0);
    if (gen < 2 || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = nmig ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) {
    CHECK(d, 0);
    if (gen < 2 || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *n = nmig ? MAX_MIG : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *out) {
    CHECK(d, 0);
    if (!nmig || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (i >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (i >= (unsigned int)nmig) return NVML_ERROR_NOT_FOUND; /* an empty slot */
    *out = &migs[d->index][i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *yes) {
    CHECK(d, 0);
    *yes = (unsigned int)is_mig(d);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    CHECK(d, 0);
    if (!is_mig(d)) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)d->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    CHECK(d, 0);
    if (!is_mig(d)) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)d->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    CHECK(d, 0);
    if (!is_mig(d)) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &devs[d->index];
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    CHECK(d, 0);
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = d->sms;
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = is_mig(d) ? 1 : 7;
    a->memorySizeMB = d->mem_total >> 20;
    return NVML_SUCCESS;
}

/* GPM: a sample records which device (and GPU instance) and its sample count; a metric of
 * a pair is computed from the later one, as the Python fake does */
struct nvmlGpmSample_st { nvmlDevice_t dev; int gi; long at; int taken; };
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
#define GPM_METRIC_MAX 477
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    CHECK(d, 0);
    if (s->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    s->isSupportedDevice = gen >= 3 && !is_mig(d); /* Hopper and later; MIG: nvmlGpmMigSampleGet */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    *out = calloc(1, sizeof **out);
    return *out ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) {
    free(s);
    return NVML_SUCCESS;
}

static nvmlReturn_t gpm_take(nvmlDevice_t d, int gi, nvmlGpmSample_t s) {
    CHECK(d, 0);
    if (gen < 3 || is_mig(d) || !s) return NVML_ERROR_NOT_SUPPORTED;
    s->dev = d, s->gi = gi, s->at = d->samples, s->taken = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) { return gpm_take(d, -1, s); }
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gi, nvmlGpmSample_t s) {
    if (!nmig) return NVML_ERROR_NOT_SUPPORTED;
    return gpm_take(d, (int)gi, s);
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (m->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!m->sample1 || !m->sample2 || !m->sample1->taken || !m->sample2->taken
        || m->sample1->dev != m->sample2->dev || m->sample1->gi != m->sample2->gi
        || m->numMetrics > GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    long t = m->sample2->at;
    int k = m->sample2->gi >= 0 ? m->sample2->gi : m->sample2->dev->index;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        double v = -1;
        unsigned int id = x->metricId;
        switch (id) {
        case 1: v = 90 + (t + k) % 10; break;                         /* graphics (engine) */
        case 2: v = 80 + t % 10; break;                               /* SM active */
        case 3: v = 35 + t % 5; break;                                /* SM occupancy */
        case 5: v = scenario == NO_TENSOR ? 0 : 60 + t % 10; break;   /* any tensor pipe */
        case 10: v = 30 + t % 20; break;                              /* DRAM bandwidth */
        case 11: v = 0; break;                                        /* FP64 */
        case 12: v = scenario == NO_TENSOR ? 70 : 10; break;          /* FP32 */
        case 13: v = 0; break;                                        /* FP16 */
        case 60: v = 1000.0 * nvlinks; break;                         /* NVLink rx, MiB/s */
        case 61: v = 2000.0 * nvlinks; break;                         /* NVLink tx, MiB/s */
        default:
            if (id >= 62 && id <= 97 && (int)(id - 62) / 2 < nvlinks) v = (id % 2 ? 2000.0 : 1000.0);
        }
        x->nvmlReturn = v < 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
        x->value = v < 0 ? 0 : v;
        x->metricInfo.shortName = x->metricInfo.longName = x->metricInfo.unit = NULL;
    }
    return NVML_SUCCESS;
}

/* page retirement (Kepler to Turing; Ampere and later remap rows instead): the two-call
 * protocol of nvmlDeviceGetRetiredPages, cause 0 (multiple single-bit) or 1 (double-bit) */
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *pages) {
    CHECK(d, 1);
    if (gen >= 2 || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = scenario == RETIRED_PAGES && d->samples >= 2 ? (cause == 0 ? 2 : 1) : 0;
    if (!pages) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) pages[i] = 0x100000ULL * (unsigned long long)(cause + 1) + 0x1000ULL * i;
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, unsigned int *pending) {
    CHECK(d, 1);
    if (gen >= 2 || is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
    *pending = scenario == RETIRED_PAGES && d->samples >= 2;
    return NVML_SUCCESS;
}
