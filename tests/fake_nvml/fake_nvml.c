/*
 * A fake libnvidia-ml.so.1 for resmon-exporter's tests.
 *
 * The unmodified pynvml loads it through LD_LIBRARY_PATH, so ctypes marshalling,
 * struct layouts and NVML return codes are the real ones. The machine it pretends
 * to be is described by a scenario file (path in $FAKE_NVML_SCENARIO, key=value
 * lines, see tests/fakenvml.py), re-read whenever the file changes so a test can
 * change the machine while the exporter runs. Every call is appended as one line
 * "<symbol> <device index>" to $FAKE_NVML_TRACE when that is set, so tests can
 * count NVML calls.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 [-DFAKE_WITH_NVML_H -I<nvml.h dir>]
 *        [-DFAKE_OLD_DRIVER] -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 * FAKE_OLD_DRIVER leaves out the symbols that drivers before R535 lack
 * (MemoryInfo_v2, TemperatureV, ClocksEventReasons, *_RunningProcesses_v3).
 */
#define _GNU_SOURCE
#ifdef FAKE_WITH_NVML_H
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>
#else
#include "fake_nvml_types.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* Layouts from shared/reference/nvml.md section 5: a drift fails the build. */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t size");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t size");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t size");
_Static_assert(nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t size");
_Static_assert(sizeof(nvmlTemperature_t) == 12, "nvmlTemperature_t size");
_Static_assert(nvmlTemperature_v1 == 0x0100000C, "nvmlTemperature_v1 version");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t size");

#define RC_GPU_IS_LOST 15

/* Every exported symbol has an id, so scenarios can override its return code or delay. */
#define FAKE_FUNCS(X)                                                                    \
    X(nvmlInitWithFlags) X(nvmlInit_v2) X(nvmlInit) X(nvmlShutdown)                      \
    X(nvmlSystemGetDriverVersion) X(nvmlSystemGetNVMLVersion)                            \
    X(nvmlSystemGetCudaDriverVersion) X(nvmlSystemGetCudaDriverVersion_v2)               \
    X(nvmlDeviceGetCount_v2) X(nvmlDeviceGetHandleByIndex_v2)                            \
    X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetHandleByPciBusId_v2)                     \
    X(nvmlDeviceGetIndex) X(nvmlDeviceGetMinorNumber) X(nvmlDeviceGetName)               \
    X(nvmlDeviceGetUUID) X(nvmlDeviceGetSerial) X(nvmlDeviceGetPciInfo_v3)               \
    X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)                             \
    X(nvmlDeviceGetBAR1MemoryInfo) X(nvmlDeviceGetUtilizationRates)                      \
    X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization)                \
    X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureV)                             \
    X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetEnforcedPowerLimit)                        \
    X(nvmlDeviceGetPowerManagementLimit) X(nvmlDeviceGetTotalEnergyConsumption)          \
    X(nvmlDeviceGetFanSpeed) X(nvmlDeviceGetNumFans) X(nvmlDeviceGetFanSpeed_v2)         \
    X(nvmlDeviceGetClockInfo) X(nvmlDeviceGetMaxClockInfo)                               \
    X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetPowerState)                          \
    X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetCurrentClocksThrottleReasons) \
    X(nvmlDeviceGetSupportedClocksEventReasons)                                          \
    X(nvmlDeviceGetComputeRunningProcesses_v3) X(nvmlDeviceGetGraphicsRunningProcesses_v3) \
    X(nvmlDeviceGetComputeRunningProcesses_v2) X(nvmlDeviceGetGraphicsRunningProcesses_v2) \
    X(nvmlDeviceGetComputeMode) X(nvmlDeviceGetPersistenceMode)                          \
    X(nvmlDeviceGetDisplayActive) X(nvmlDeviceGetDisplayMode)                            \
    X(nvmlDeviceGetTotalEccErrors) X(nvmlDeviceGetMigMode) X(nvmlDeviceIsMigDeviceHandle) \
    X(nvmlDeviceGetMaxMigDeviceCount) X(nvmlDeviceGetProcessUtilization)                 \
    X(nvmlDeviceGetDriverModel_v2) X(nvmlDeviceGetDriverModel)                           \
    X(nvmlDeviceGetConfComputeMemSizeInfo) X(nvmlDeviceGetCudaComputeCapability)         \
    X(nvmlDeviceGetPcieThroughput) X(nvmlDeviceGetRunningProcessDetailList)             \
    X(nvmlEventSetCreate) X(nvmlDeviceRegisterEvents) X(nvmlDeviceGetSupportedEventTypes) \
    X(nvmlEventSetWait_v2) X(nvmlEventSetWait) X(nvmlEventSetFree)

enum {
#define X(n) FN_##n,
    FAKE_FUNCS(X)
#undef X
    FN_COUNT
};
static const char *const fn_names[FN_COUNT] = {
#define X(n) #n,
    FAKE_FUNCS(X)
#undef X
};

#define MAX_GPUS 256
#define MAX_PROCS 64
#define UNSET (-1)

typedef struct {
    unsigned int pid;
    unsigned long long mem;
} fake_proc_t;

typedef struct {
    char name[96], uuid[96], pci_bus_id[32], serial[32];
    unsigned long long mem_total, mem_used, mem_reserved;
    unsigned int util_gpu, util_mem, enc_util, dec_util;
    int temperature;
    unsigned int power_mw, power_limit_mw, power_mgmt_limit_mw;
    unsigned long long energy_mj;
    unsigned int fan, num_fans;
    unsigned int clock[4], max_clock[4];
    int pstate;
    unsigned long long reasons, supported_reasons;
    int cc_major, cc_minor;
    int n_compute, n_graphics;
    fake_proc_t compute[MAX_PROCS], graphics[MAX_PROCS];
    int rc_all;
    int rc[FN_COUNT];
    int delay_ms[FN_COUNT];
} fake_gpu_t;

/* Handles are pointers into this array; the struct itself is opaque to callers. */
struct nvmlDevice_st {
    int index;
};
static struct nvmlDevice_st g_handles[MAX_GPUS];

static struct {
    int init_rc;
    int count;
    char driver[80], nvml_version[80];
    int cuda_version;
    int rc[FN_COUNT];
    int delay_ms[FN_COUNT];
    fake_gpu_t gpus[MAX_GPUS];
} g;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_init_refs;
static int g_loaded;               /* 0 never, 1 from file, 2 defaults (no file) */
static struct stat g_scenario_st;
static int g_trace_fd = -2;

/* Event sets and injected XIDs live in fake_events.c (included at the end). Hooks: */
static int events_gpu_key(int idx, const char *k, const char *v); /* gpu.<i>.<k>: 1 = handled */
static int events_key(const char *k, const char *v);              /* top-level key: 1 = handled */
static void events_defaults(void);     /* per-reload defaults (before the file is parsed) */
static void events_after_reload(void); /* after the file was parsed: deliver new injected events */
static void events_on_shutdown(void);  /* the last nvmlShutdown: every event set is gone */

static const char *const clock_names[4] = {"graphics", "sm", "memory", "video"};

static void gpu_defaults(int i, fake_gpu_t *gp) {
    memset(gp, 0, sizeof(*gp));
    snprintf(gp->name, sizeof gp->name, "NVIDIA H100 80GB HBM3");
    snprintf(gp->uuid, sizeof gp->uuid, "GPU-%08x-1111-2222-3333-%012x", 0xabcd0000u + i, i);
    snprintf(gp->pci_bus_id, sizeof gp->pci_bus_id, "00000000:%02X:00.0", (0x07 + i) & 0xff);
    snprintf(gp->serial, sizeof gp->serial, "165%010d", i);
    gp->mem_total = 85899345920ULL; /* 80 GiB */
    gp->mem_used = 1073741824ULL;
    gp->mem_reserved = 536870912ULL;
    gp->util_gpu = 0;
    gp->util_mem = 0;
    gp->temperature = 35;
    gp->power_mw = 70000;
    gp->power_limit_mw = 700000;
    gp->power_mgmt_limit_mw = 700000;
    gp->energy_mj = 1000000ULL;
    gp->fan = 30;
    gp->num_fans = 1;
    gp->clock[0] = 345; gp->clock[1] = 345; gp->clock[2] = 2619; gp->clock[3] = 765;
    gp->max_clock[0] = 1980; gp->max_clock[1] = 1980; gp->max_clock[2] = 2619; gp->max_clock[3] = 1545;
    gp->pstate = 0;
    gp->reasons = 0x1;
    gp->supported_reasons = 0x1ff;
    gp->cc_major = 9;
    gp->cc_minor = 0;
    gp->rc_all = UNSET;
    for (int f = 0; f < FN_COUNT; f++) {
        gp->rc[f] = UNSET;
        gp->delay_ms[f] = 0;
    }
}

static void set_defaults(void) {
    g.init_rc = 0;
    g.count = 1;
    snprintf(g.driver, sizeof g.driver, "550.54.15");
    snprintf(g.nvml_version, sizeof g.nvml_version, "12.550.54.15");
    g.cuda_version = 12040;
    for (int f = 0; f < FN_COUNT; f++) {
        g.rc[f] = UNSET;
        g.delay_ms[f] = 0;
    }
    for (int i = 0; i < MAX_GPUS; i++) gpu_defaults(i, &g.gpus[i]);
    events_defaults();
}

static int fn_id(const char *name) {
    for (int f = 0; f < FN_COUNT; f++)
        if (strcmp(fn_names[f], name) == 0) return f;
    return -1;
}

static void warn_key(const char *key) { fprintf(stderr, "fake-nvml: ignoring unknown scenario key %s\n", key); }

static unsigned long long num(const char *v) { return strtoull(v, NULL, 0); }

static void copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src); }

/* "pid:bytes,pid:bytes" */
static int parse_procs(const char *v, fake_proc_t *out) {
    int n = 0;
    const char *p = v;
    while (*p && n < MAX_PROCS) {
        char *end;
        unsigned long pid = strtoul(p, &end, 0);
        if (end == p) break;
        unsigned long long mem = 0;
        if (*end == ':') mem = strtoull(end + 1, &end, 0);
        out[n].pid = (unsigned int)pid;
        out[n].mem = mem;
        n++;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

/* rc.<symbol>, delay_ms.<symbol>: return 1 when handled */
static int parse_override(const char *key, const char *val, int *rc, int *delay) {
    if (strncmp(key, "rc.", 3) == 0) {
        int f = fn_id(key + 3);
        if (f < 0) return 0;
        rc[f] = (int)num(val);
        return 1;
    }
    if (strncmp(key, "delay_ms.", 9) == 0) {
        int f = fn_id(key + 9);
        if (f < 0) return 0;
        delay[f] = (int)num(val);
        return 1;
    }
    return 0;
}

static void parse_gpu_key(fake_gpu_t *gp, const char *k, const char *v, const char *full) {
    if (strcmp(k, "name") == 0) copy(gp->name, sizeof gp->name, v);
    else if (strcmp(k, "uuid") == 0) copy(gp->uuid, sizeof gp->uuid, v);
    else if (strcmp(k, "pci_bus_id") == 0) copy(gp->pci_bus_id, sizeof gp->pci_bus_id, v);
    else if (strcmp(k, "serial") == 0) copy(gp->serial, sizeof gp->serial, v);
    else if (strcmp(k, "memory_total") == 0) gp->mem_total = num(v);
    else if (strcmp(k, "memory_used") == 0) gp->mem_used = num(v);
    else if (strcmp(k, "memory_reserved") == 0) gp->mem_reserved = num(v);
    else if (strcmp(k, "util_gpu") == 0) gp->util_gpu = (unsigned int)num(v);
    else if (strcmp(k, "util_memory") == 0) gp->util_mem = (unsigned int)num(v);
    else if (strcmp(k, "encoder_util") == 0) gp->enc_util = (unsigned int)num(v);
    else if (strcmp(k, "decoder_util") == 0) gp->dec_util = (unsigned int)num(v);
    else if (strcmp(k, "temperature") == 0) gp->temperature = (int)strtol(v, NULL, 0);
    else if (strcmp(k, "power_mw") == 0) gp->power_mw = (unsigned int)num(v);
    else if (strcmp(k, "power_limit_mw") == 0) gp->power_limit_mw = (unsigned int)num(v);
    else if (strcmp(k, "power_management_limit_mw") == 0) gp->power_mgmt_limit_mw = (unsigned int)num(v);
    else if (strcmp(k, "energy_mj") == 0) gp->energy_mj = num(v);
    else if (strcmp(k, "fan") == 0) gp->fan = (unsigned int)num(v);
    else if (strcmp(k, "num_fans") == 0) gp->num_fans = (unsigned int)num(v);
    else if (strcmp(k, "pstate") == 0) gp->pstate = (int)num(v);
    else if (strcmp(k, "clocks_event_reasons") == 0) gp->reasons = num(v);
    else if (strcmp(k, "supported_clocks_event_reasons") == 0) gp->supported_reasons = num(v);
    else if (strcmp(k, "cuda_cc") == 0) sscanf(v, "%d.%d", &gp->cc_major, &gp->cc_minor);
    else if (strcmp(k, "processes") == 0) gp->n_compute = parse_procs(v, gp->compute);
    else if (strcmp(k, "graphics_processes") == 0) gp->n_graphics = parse_procs(v, gp->graphics);
    else if (strcmp(k, "rc.all") == 0) gp->rc_all = (int)num(v);
    else if (strncmp(k, "clock.", 6) == 0 || strncmp(k, "max_clock.", 10) == 0) {
        int is_max = k[0] == 'm';
        const char *which = strchr(k, '.') + 1;
        for (int c = 0; c < 4; c++)
            if (strcmp(which, clock_names[c]) == 0) {
                (is_max ? gp->max_clock : gp->clock)[c] = (unsigned int)num(v);
                return;
            }
        warn_key(full);
    } else if (!parse_override(k, v, gp->rc, gp->delay_ms) && !events_gpu_key((int)(gp - g.gpus), k, v))
        warn_key(full);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static void parse_file(FILE *f) {
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = '\0';
        char *key = trim(line), *val = trim(eq + 1);
        if (!*key) continue;
        if (strncmp(key, "gpu.", 4) == 0) {
            char *end;
            long idx = strtol(key + 4, &end, 10);
            if (end == key + 4 || *end != '.' || idx < 0 || idx >= MAX_GPUS) {
                warn_key(key);
                continue;
            }
            parse_gpu_key(&g.gpus[idx], end + 1, val, key);
        } else if (strcmp(key, "init") == 0) g.init_rc = (int)num(val);
        else if (strcmp(key, "count") == 0) {
            long c = (long)num(val);
            g.count = c < 0 ? 0 : (c > MAX_GPUS ? MAX_GPUS : (int)c);
        } else if (strcmp(key, "driver_version") == 0) copy(g.driver, sizeof g.driver, val);
        else if (strcmp(key, "nvml_version") == 0) copy(g.nvml_version, sizeof g.nvml_version, val);
        else if (strcmp(key, "cuda_version") == 0) g.cuda_version = (int)num(val);
        else if (!parse_override(key, val, g.rc, g.delay_ms) && !events_key(key, val)) warn_key(key);
    }
}

/* Called with g_mu held: re-read the scenario when the file is new or changed. */
static void maybe_reload(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        if (g_loaded != 2) {
            set_defaults();
            g_loaded = 2;
        }
        return;
    }
    if (g_loaded == 1 && st.st_ino == g_scenario_st.st_ino && st.st_size == g_scenario_st.st_size &&
        st.st_mtim.tv_sec == g_scenario_st.st_mtim.tv_sec && st.st_mtim.tv_nsec == g_scenario_st.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    set_defaults();
    parse_file(f);
    fclose(f);
    g_scenario_st = st;
    g_loaded = 1;
    events_after_reload();
}

static void trace(int fn, int idx) {
    if (g_trace_fd == -2) {
        const char *path = getenv("FAKE_NVML_TRACE");
        g_trace_fd = path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    }
    if (g_trace_fd < 0) return;
    char buf[128];
    int n = snprintf(buf, sizeof buf, "%s %d\n", fn_names[fn], idx);
    if (write(g_trace_fd, buf, (size_t)n) < 0) { /* tracing is best effort */ }
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int handle_index(nvmlDevice_t dev) {
    if (dev < g_handles || dev >= g_handles + MAX_GPUS) return -1;
    return (int)(dev - g_handles);
}

static int override_rc(int fn, int idx) {
    if (idx >= 0) {
        const fake_gpu_t *gp = &g.gpus[idx];
        if (gp->rc_all != UNSET) return gp->rc_all;
        if (gp->rc[fn] != UNSET) return gp->rc[fn];
    }
    return g.rc[fn] != UNSET ? g.rc[fn] : NVML_SUCCESS;
}

/* Entry of every call. Returns with g_mu held; the delay is slept outside the lock so a
 * "wedged" call does not stop other threads. idx < 0: not a device call. */
static nvmlReturn_t enter(int fn, int idx, int needs_init) {
    pthread_mutex_lock(&g_mu);
    maybe_reload();
    trace(fn, idx);
    int delay = g.delay_ms[fn];
    if (idx >= 0 && idx < MAX_GPUS && g.gpus[idx].delay_ms[fn]) delay = g.gpus[idx].delay_ms[fn];
    if (delay > 0) {
        pthread_mutex_unlock(&g_mu);
        sleep_ms(delay);
        pthread_mutex_lock(&g_mu);
        maybe_reload();
    }
    if (needs_init && g_init_refs <= 0) return NVML_ERROR_UNINITIALIZED;
    return (nvmlReturn_t)override_rc(fn, idx < MAX_GPUS ? idx : -1);
}

static nvmlReturn_t leave(nvmlReturn_t rc) {
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Device call prologue: validates the handle, applies overrides, leaves gp pointing at the GPU. */
#define DEV_ENTER(fn)                                                               \
    int idx_ = handle_index(device);                                                \
    nvmlReturn_t rc_ = enter(FN_##fn, idx_, 1);                                     \
    if (rc_ == NVML_SUCCESS && (idx_ < 0 || idx_ >= g.count))                       \
        rc_ = NVML_ERROR_INVALID_ARGUMENT;                                          \
    if (rc_ != NVML_SUCCESS) return leave(rc_);                                     \
    fake_gpu_t *gp = &g.gpus[idx_];                                                 \
    (void)gp

#define SYS_ENTER(fn)                                                               \
    nvmlReturn_t rc_ = enter(FN_##fn, -1, 1);                                       \
    if (rc_ != NVML_SUCCESS) return leave(rc_)

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init, system ---- */

static nvmlReturn_t do_init(int fn) {
    nvmlReturn_t rc = enter(fn, -1, 0);
    if (rc == NVML_SUCCESS && g.init_rc != 0) rc = g.init_rc;
    if (rc == NVML_SUCCESS) g_init_refs++;
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(FN_nvmlInitWithFlags); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(FN_nvmlInit_v2); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(FN_nvmlInit); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    SYS_ENTER(nvmlShutdown);
    if (--g_init_refs == 0) events_on_shutdown();
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch ((int)result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    case 25: return "Argument version mismatch";
    case 999: return "Unknown Error";
    default: return "Fake NVML error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    SYS_ENTER(nvmlSystemGetDriverVersion);
    return leave(copy_out(version, length, g.driver));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    SYS_ENTER(nvmlSystemGetNVMLVersion);
    return leave(copy_out(version, length, g.nvml_version));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    SYS_ENTER(nvmlSystemGetCudaDriverVersion);
    if (!v) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *v = g.cuda_version;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    SYS_ENTER(nvmlSystemGetCudaDriverVersion_v2);
    if (!v) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *v = g.cuda_version;
    return leave(NVML_SUCCESS);
}

/* ---- enumeration ---- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    SYS_ENTER(nvmlDeviceGetCount_v2);
    if (!deviceCount) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = (unsigned int)g.count;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    int idx = index < MAX_GPUS ? (int)index : -1;
    nvmlReturn_t rc = enter(FN_nvmlDeviceGetHandleByIndex_v2, idx, 1);
    if (rc == NVML_SUCCESS && (idx < 0 || idx >= g.count || !device)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        g_handles[idx].index = idx;
        *device = &g_handles[idx];
    }
    return leave(rc);
}

static nvmlReturn_t handle_by(int fn, const char *key, nvmlDevice_t *device, int by_uuid) {
    nvmlReturn_t rc = enter(fn, -1, 1);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!key || !device) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g.count; i++) {
        const char *v = by_uuid ? g.gpus[i].uuid : g.gpus[i].pci_bus_id;
        if (strcasecmp(v, key) == 0) {
            int r = override_rc(fn, i);
            if (r != NVML_SUCCESS) return leave(r);
            g_handles[i].index = i;
            *device = &g_handles[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return handle_by(FN_nvmlDeviceGetHandleByUUID, uuid, device, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return handle_by(FN_nvmlDeviceGetHandleByPciBusId_v2, pciBusId, device, 0);
}

/* ---- identity ---- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_ENTER(nvmlDeviceGetIndex);
    if (!index) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)idx_;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEV_ENTER(nvmlDeviceGetMinorNumber);
    if (!minor) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *minor = (unsigned int)idx_;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER(nvmlDeviceGetName);
    return leave(copy_out(name, length, gp->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER(nvmlDeviceGetUUID);
    return leave(copy_out(uuid, length, gp->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEV_ENTER(nvmlDeviceGetSerial);
    return leave(copy_out(serial, length, gp->serial));
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER(nvmlDeviceGetPciInfo_v3);
    if (!pci) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof(*pci));
    unsigned int dom = 0, bus = 0, dev = 0, fn = 0;
    sscanf(gp->pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DE;
    pci->pciSubSystemId = 0x16C110DE;
    snprintf(pci->busId, sizeof pci->busId, "%s", gp->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xffff, bus, dev, fn);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV_ENTER(nvmlDeviceGetCudaComputeCapability);
    if (!major || !minor) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *major = gp->cc_major;
    *minor = gp->cc_minor;
    return leave(NVML_SUCCESS);
}

/* ---- memory ---- */

static unsigned long long mem_free(const fake_gpu_t *gp) {
    unsigned long long taken = gp->mem_used + gp->mem_reserved;
    return taken > gp->mem_total ? 0 : gp->mem_total - taken;
}

/* v1: "used" is allocated plus reserved (R510 and later), so used + free == total */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEV_ENTER(nvmlDeviceGetMemoryInfo);
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = gp->mem_total;
    memory->free = mem_free(gp);
    memory->used = gp->mem_used + gp->mem_reserved;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEV_ENTER(nvmlDeviceGetMemoryInfo_v2);
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory->total = gp->mem_total;
    memory->reserved = gp->mem_reserved;
    memory->free = mem_free(gp);
    memory->used = gp->mem_used;
    return leave(NVML_SUCCESS);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    DEV_ENTER(nvmlDeviceGetBAR1MemoryInfo);
    if (!bar1) return leave(NVML_ERROR_INVALID_ARGUMENT);
    bar1->bar1Total = 134217728ULL;
    bar1->bar1Used = 2097152ULL;
    bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
    return leave(NVML_SUCCESS);
}

/* ---- utilization ---- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEV_ENTER(nvmlDeviceGetUtilizationRates);
    if (!u) return leave(NVML_ERROR_INVALID_ARGUMENT);
    u->gpu = gp->util_gpu;
    u->memory = gp->util_mem;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    DEV_ENTER(nvmlDeviceGetEncoderUtilization);
    if (!utilization || !samplingPeriodUs) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *utilization = gp->enc_util;
    *samplingPeriodUs = 167000;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    DEV_ENTER(nvmlDeviceGetDecoderUtilization);
    if (!utilization || !samplingPeriodUs) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *utilization = gp->dec_util;
    *samplingPeriodUs = 167000;
    return leave(NVML_SUCCESS);
}

/* ---- temperature, power, fan ---- */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp) {
    DEV_ENTER(nvmlDeviceGetTemperature);
    if (!temp || (int)sensorType != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = (unsigned int)gp->temperature;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    DEV_ENTER(nvmlDeviceGetTemperatureV);
    if (!temperature || (int)temperature->sensorType != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != nvmlTemperature_v1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    temperature->temperature = gp->temperature;
    return leave(NVML_SUCCESS);
}
#endif

#define UINT_GETTER(fn, field)                                                      \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {                \
        DEV_ENTER(fn);                                                              \
        if (!out) return leave(NVML_ERROR_INVALID_ARGUMENT);                        \
        *out = gp->field;                                                           \
        return leave(NVML_SUCCESS);                                                 \
    }

UINT_GETTER(nvmlDeviceGetPowerUsage, power_mw)
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_limit_mw)
UINT_GETTER(nvmlDeviceGetPowerManagementLimit, power_mgmt_limit_mw)
UINT_GETTER(nvmlDeviceGetFanSpeed, fan)
UINT_GETTER(nvmlDeviceGetNumFans, num_fans)

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    DEV_ENTER(nvmlDeviceGetTotalEnergyConsumption);
    if (!energy) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *energy = gp->energy_mj;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    DEV_ENTER(nvmlDeviceGetFanSpeed_v2);
    if (!speed || fan >= gp->num_fans) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *speed = gp->fan;
    return leave(NVML_SUCCESS);
}

/* ---- clocks, performance ---- */

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER(nvmlDeviceGetClockInfo);
    if (!clock || (int)type < 0 || (int)type > 3) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *clock = gp->clock[type];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER(nvmlDeviceGetMaxClockInfo);
    if (!clock || (int)type < 0 || (int)type > 3) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *clock = gp->max_clock[type];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState) {
    DEV_ENTER(nvmlDeviceGetPerformanceState);
    if (!pState) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *pState = (nvmlPstates_t)gp->pstate;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState) {
    DEV_ENTER(nvmlDeviceGetPowerState);
    if (!pState) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *pState = (nvmlPstates_t)gp->pstate;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEV_ENTER(nvmlDeviceGetCurrentClocksEventReasons);
    if (!reasons) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = gp->reasons;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEV_ENTER(nvmlDeviceGetSupportedClocksEventReasons);
    if (!reasons) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = gp->supported_reasons;
    return leave(NVML_SUCCESS);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEV_ENTER(nvmlDeviceGetCurrentClocksThrottleReasons);
    if (!reasons) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = gp->reasons;
    return leave(NVML_SUCCESS);
}

/* ---- processes: the two-call protocol ---- */

static nvmlReturn_t list_procs(const fake_proc_t *procs, int n, unsigned int *infoCount, nvmlProcessInfo_t *infos) {
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (*infoCount < (unsigned int)n) {
        *infoCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = procs[i].mem;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *infoCount = (unsigned int)n;
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    DEV_ENTER(nvmlDeviceGetComputeRunningProcesses_v3);
    return leave(list_procs(gp->compute, gp->n_compute, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos) {
    DEV_ENTER(nvmlDeviceGetGraphicsRunningProcesses_v3);
    return leave(list_procs(gp->graphics, gp->n_graphics, infoCount, infos));
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos) {
    DEV_ENTER(nvmlDeviceGetComputeRunningProcesses_v2);
    return leave(list_procs(gp->compute, gp->n_compute, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos) {
    DEV_ENTER(nvmlDeviceGetGraphicsRunningProcesses_v2);
    return leave(list_procs(gp->graphics, gp->n_graphics, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    DEV_ENTER(nvmlDeviceGetProcessUtilization);
    (void)utilization;
    (void)lastSeenTimeStamp;
    if (!processSamplesCount) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *processSamplesCount = 0;
    return leave(NVML_ERROR_NOT_FOUND);
}

/* ---- modes and the rest that gpustat / nvitop ask for ---- */

#define ENUM_GETTER(fn, type, value)                                                \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, type *out) {                        \
        DEV_ENTER(fn);                                                              \
        if (!out) return leave(NVML_ERROR_INVALID_ARGUMENT);                        \
        *out = (type)(value);                                                       \
        return leave(NVML_SUCCESS);                                                 \
    }

ENUM_GETTER(nvmlDeviceGetComputeMode, nvmlComputeMode_t, 0)
ENUM_GETTER(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, 1)
ENUM_GETTER(nvmlDeviceGetDisplayActive, nvmlEnableState_t, 0)
ENUM_GETTER(nvmlDeviceGetDisplayMode, nvmlEnableState_t, 0)

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEV_ENTER(nvmlDeviceGetTotalEccErrors);
    (void)errorType;
    (void)counterType;
    if (!eccCounts) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *eccCounts = 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEV_ENTER(nvmlDeviceGetMigMode);
    (void)currentMode;
    (void)pendingMode;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    DEV_ENTER(nvmlDeviceIsMigDeviceHandle);
    if (!isMigDevice) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEV_ENTER(nvmlDeviceGetMaxMigDeviceCount);
    (void)count;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, nvmlDriverModel_t *current,
                                                nvmlDriverModel_t *pending) {
    DEV_ENTER(nvmlDeviceGetDriverModel_v2);
    (void)current;
    (void)pending;
    return leave(NVML_ERROR_NOT_SUPPORTED); /* Windows only */
}

EXPORT nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, nvmlDriverModel_t *current,
                                             nvmlDriverModel_t *pending) {
    DEV_ENTER(nvmlDeviceGetDriverModel);
    (void)current;
    (void)pending;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, nvmlConfComputeMemSizeInfo_t *memInfo) {
    DEV_ENTER(nvmlDeviceGetConfComputeMemSizeInfo);
    (void)memInfo;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                unsigned int *value) {
    DEV_ENTER(nvmlDeviceGetPcieThroughput);
    (void)counter;
    (void)value;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

/* Present on drivers >= 535.86; nvitop picks its process struct layout by this symbol. */
EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist) {
    DEV_ENTER(nvmlDeviceGetRunningProcessDetailList);
    (void)plist;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

/* ---- event sets (XID) ---- */
#include "fake_events.c"
