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
 * (MemoryInfo_v2, TemperatureV, ClocksEventReasons, *_RunningProcesses_v3), and GPM.
 *
 * Health features (ECC, retired pages, remapped rows, NVLink, PCIe link, field values,
 * violation time, sample buffers) follow the scenario-key contract in tests/fakenvml.py;
 * each one answers NOT_SUPPORTED until its keys are set, so old scenarios are unchanged.
 * Processes (issue 11): pid:na memory, per-process utilization samples and MIG devices
 * (mig_uuids) follow the same rule: without their keys every call answers as before.
 * GPM and full MIG devices (issue 13: gpm*, gi.<gi>.gpm*, mig_devices, mig_mode) too; the
 * old-driver build exports no nvmlGpm* symbol.
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
#include <stdint.h>
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
/* shared/reference/nvml-extended.md sections 3-5 */
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t size");
_Static_assert(__builtin_offsetof(nvmlFieldValue_t, timestamp) == 8, "nvmlFieldValue_t.timestamp");
_Static_assert(__builtin_offsetof(nvmlFieldValue_t, valueType) == 24, "nvmlFieldValue_t.valueType");
_Static_assert(__builtin_offsetof(nvmlFieldValue_t, nvmlReturn) == 28, "nvmlFieldValue_t.nvmlReturn");
_Static_assert(__builtin_offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t.value");
_Static_assert(sizeof(nvmlSample_t) == 16, "nvmlSample_t size");
_Static_assert(sizeof(nvmlViolationTime_t) == 16, "nvmlViolationTime_t size");
/* nvml.h and pynvml's c_nvmlProcessUtilizationSample_t: pid, 4 bytes padding, timeStamp, 4 utils */
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t size");
_Static_assert(__builtin_offsetof(nvmlProcessUtilizationSample_t, timeStamp) == 8, "sample.timeStamp");
_Static_assert(__builtin_offsetof(nvmlProcessUtilizationSample_t, smUtil) == 16, "sample.smUtil");
_Static_assert(__builtin_offsetof(nvmlProcessUtilizationSample_t, memUtil) == 20, "sample.memUtil");
_Static_assert(__builtin_offsetof(nvmlProcessUtilizationSample_t, encUtil) == 24, "sample.encUtil");
_Static_assert(__builtin_offsetof(nvmlProcessUtilizationSample_t, decUtil) == 28, "sample.decUtil");

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
    X(nvmlDeviceGetMigDeviceHandleByIndex) X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle) \
    X(nvmlDeviceGetDriverModel_v2) X(nvmlDeviceGetDriverModel)                           \
    X(nvmlDeviceGetConfComputeMemSizeInfo) X(nvmlDeviceGetCudaComputeCapability)         \
    X(nvmlDeviceGetPcieThroughput) X(nvmlDeviceGetRunningProcessDetailList)             \
    X(nvmlDeviceGetFieldValues) X(nvmlDeviceGetEccMode)                                  \
    X(nvmlDeviceGetRetiredPages) X(nvmlDeviceGetRetiredPages_v2)                         \
    X(nvmlDeviceGetRetiredPagesPendingStatus) X(nvmlDeviceGetRemappedRows)               \
    X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetNvLinkErrorCounter)                       \
    X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetMaxPcieLinkGeneration)         \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkWidth)           \
    X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetPcieReplayCounter)                   \
    X(nvmlDeviceGetViolationStatus) X(nvmlDeviceGetSamples)                              \
    X(nvmlEventSetCreate) X(nvmlDeviceRegisterEvents) X(nvmlDeviceGetSupportedEventTypes) \
    X(nvmlEventSetWait_v2) X(nvmlEventSetWait) X(nvmlEventSetFree)                       \
    X(nvmlGpmQueryDeviceSupport) X(nvmlGpmSampleAlloc) X(nvmlGpmSampleFree)              \
    X(nvmlGpmSampleGet) X(nvmlGpmMigSampleGet) X(nvmlGpmMetricsGet)                      \
    X(nvmlDeviceGetGpuInstanceId) X(nvmlDeviceGetComputeInstanceId)                      \
    X(nvmlDeviceGetGpuInstanceById) X(nvmlGpuInstanceGetInfo)

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
#define MAX_PROCS 512          /* entries of one processes / graphics_processes list */
#define FAKE_MAX_PUTIL 1024    /* process_util samples per GPU (several may name one pid) */
#define FAKE_MAX_MIG 8         /* mig_uuids per GPU (7 is the most an A100 / H100 makes) */
#define FAKE_GPM_IDS 128      /* GPM metric ids the fake models (0..127; higher: NOT_SUPPORTED) */
#define FAKE_MAX_GI 16         /* GPU instance ids 0..15 (an H100 uses 1..14) */
#define FAKE_UUID_LEN 96       /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define MEM_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL /* usedGpuMemory unknown: pynvml gives None */
#define UNSET (-1)

typedef struct {
    unsigned int pid;
    unsigned long long mem;
} fake_proc_t;

/* Health features. Array sizes are the fake's own limits, not the header's. */
#define FAKE_MAX_NVLINKS 36     /* NVML_NVLINK_MAX_LINKS in the 13.x header */
#define FAKE_NVLINK_COUNTERS 5  /* nvmlNvLinkErrorCounter_t 0..4 */
#define FAKE_MAX_FIELDS 128     /* distinct field.<id>[@scope] entries per GPU */
#define FAKE_MAX_PATTERN 64     /* values of one samples.<type> pattern */
#define FAKE_VIOLATION_POLICIES 12 /* nvmlPerfPolicyType_t 0..11 */
#define FAKE_SAMPLE_TYPES 5     /* nvmlSamplingType_t 1..4 answer (index 0 unused) */
#define FAKE_ALL_LINKS 0xFFFFFFFFu
#define FIELD_NVLINK_LINK_COUNT 91
#define FIELD_NVLINK_DATA_TX 138
#define FIELD_NVLINK_RAW_RX 141
/* Field ids answered from the state of a direct call (field_model); NVML_FI_DEV_* in nvml.h */
#define FIELD_ECC_CURRENT 1
#define FIELD_ECC_PENDING 2
#define FIELD_ECC_SBE_VOL_TOTAL 3       /* 3..6: SBE / DBE volatile, SBE / DBE aggregate */
#define FIELD_ECC_DBE_AGG_TOTAL 6
#define FIELD_RETIRED_SBE 29
#define FIELD_RETIRED_DBE 30
#define FIELD_RETIRED_PENDING 31
#define FIELD_TOTAL_ENERGY 83
#define FIELD_PCIE_REPLAY_COUNTER 94
#define FIELD_REMAPPED_COR 142          /* 142..145: correctable, uncorrectable, pending, failure */
#define FIELD_REMAPPED_FAILURE 145
#define FIELD_NVLINK_DL_REPLAY 161      /* 161..163: error counters 0..2, scopeId = link */
#define FIELD_NVLINK_DL_CRC 163
#define FIELD_NVLINK_GET_STATE 165
#define FIELD_POWER_AVERAGE 185
#define FIELD_POWER_INSTANT 186
#define FIELD_POWER_CURRENT_LIMIT 190
#define FIELD_GPU_TEMP 308              /* the newest drivers' only: an old-driver build does not know it */

#ifdef FAKE_WITH_NVML_H
/* The ids above are the header's: a drift fails the build. */
_Static_assert(FIELD_NVLINK_LINK_COUNT == NVML_FI_DEV_NVLINK_LINK_COUNT, "field 91");
_Static_assert(FIELD_NVLINK_DATA_TX == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "field 138");
_Static_assert(FIELD_NVLINK_RAW_RX == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, "field 141");
_Static_assert(FIELD_ECC_CURRENT == NVML_FI_DEV_ECC_CURRENT, "field 1");
_Static_assert(FIELD_ECC_PENDING == NVML_FI_DEV_ECC_PENDING, "field 2");
_Static_assert(FIELD_ECC_SBE_VOL_TOTAL == NVML_FI_DEV_ECC_SBE_VOL_TOTAL && NVML_FI_DEV_ECC_DBE_VOL_TOTAL == 4 &&
               NVML_FI_DEV_ECC_SBE_AGG_TOTAL == 5 && FIELD_ECC_DBE_AGG_TOTAL == NVML_FI_DEV_ECC_DBE_AGG_TOTAL, "fields 3-6");
_Static_assert(FIELD_RETIRED_SBE == NVML_FI_DEV_RETIRED_SBE && FIELD_RETIRED_DBE == NVML_FI_DEV_RETIRED_DBE &&
               FIELD_RETIRED_PENDING == NVML_FI_DEV_RETIRED_PENDING, "fields 29-31");
_Static_assert(FIELD_TOTAL_ENERGY == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "field 83");
_Static_assert(FIELD_PCIE_REPLAY_COUNTER == NVML_FI_DEV_PCIE_REPLAY_COUNTER, "field 94");
_Static_assert(FIELD_REMAPPED_COR == NVML_FI_DEV_REMAPPED_COR && NVML_FI_DEV_REMAPPED_UNC == 143 &&
               NVML_FI_DEV_REMAPPED_PENDING == 144 && FIELD_REMAPPED_FAILURE == NVML_FI_DEV_REMAPPED_FAILURE,
               "fields 142-145");
_Static_assert(FIELD_NVLINK_DL_REPLAY == NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY &&
               NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY == 162 && FIELD_NVLINK_DL_CRC == NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
               "fields 161-163");
_Static_assert(FIELD_NVLINK_GET_STATE == NVML_FI_DEV_NVLINK_GET_STATE, "field 165");
_Static_assert(FIELD_GPU_TEMP == NVML_FI_DEV_GPU_TEMP, "field 308");
_Static_assert(FIELD_POWER_AVERAGE == NVML_FI_DEV_POWER_AVERAGE && FIELD_POWER_INSTANT == NVML_FI_DEV_POWER_INSTANT &&
               FIELD_POWER_CURRENT_LIMIT == NVML_FI_DEV_POWER_CURRENT_LIMIT, "fields 185, 186, 190");
_Static_assert(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0 == 32 && NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6 == 96 &&
               NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 == 39 && NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 == 102 &&
               NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0 == 46 && NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6 == 108 &&
               NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0 == 53 && NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6 == 114 &&
               NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L11 == 119, "legacy per-link NVLink fields");
#endif

typedef struct {
    int active;
    unsigned long long tx_kib, rx_kib;
    unsigned long long errors[FAKE_NVLINK_COUNTERS];
} fake_nvlink_t;

/* One field.<id>[@<scope>] / field_double / field_type / field_rc key set. */
typedef struct {
    unsigned int id, scope;
    int any_scope;         /* 1: the plain key (every scope) */
    int kind;              /* 0 no value, 1 integer, 2 double */
    int type;              /* UNSET or the reported valueType (field_type) */
    int rc;                /* UNSET or the entry's own nvmlReturn (field_rc) */
    unsigned long long u;
    double d;
} fake_field_t;

/* GPM values of one source (a GPU, or one GPU instance): set 1 value in milli-units
 * (percent or MiB/s), 2 NaN, 3 the window itself in seconds; rc UNSET or that metric's return */
typedef struct {
    unsigned char set[FAKE_GPM_IDS];
    long long milli[FAKE_GPM_IDS];
    int rc[FAKE_GPM_IDS];
} fake_gpm_t;

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
    /* The lists are on the heap (gpu_defaults frees them): 512 entries in every one of the
     * MAX_GPUS static slots would be megabytes cleared on each reload. */
    int n_compute, n_graphics;
    fake_proc_t *compute, *graphics;
    int putil_supported;       /* process_util_supported (default 1) */
    int n_putil;
    nvmlProcessUtilizationSample_t *putil;
    int mig_enabled;           /* mig_uuids present (also when empty: MIG on, no instance) */
    int n_mig;
    char mig_uuid[FAKE_MAX_MIG][FAKE_UUID_LEN];
    /* mig_devices (the full form): per slot its return (0 present, 6 NOT_FOUND, 2
     * INVALID_ARGUMENT), GPU / compute instance ids, profile and memory; mig_detail 0: mig_uuids */
    int mig_detail, mig_current, mig_pending;
    int mig_slot_rc[FAKE_MAX_MIG];
    unsigned int mig_gi[FAKE_MAX_MIG], mig_ci[FAKE_MAX_MIG];
    char mig_profile[FAKE_MAX_MIG][32];
    /* the slot's GPU instance profile id and placement (start, size): nvmlGpuInstanceGetInfo;
     * -1: not given (the call answers NOT_SUPPORTED) */
    int mig_gi_profile[FAKE_MAX_MIG], mig_start[FAKE_MAX_MIG], mig_size[FAKE_MAX_MIG];
    long long minor; /* nvmlDeviceGetMinorNumber; UNSET: the index */
    unsigned long long mig_mem_total[FAKE_MAX_MIG], mig_mem_used[FAKE_MAX_MIG];
    /* ECC: ecc -1 none, 0 off, 1 on; ecc_count[errorType][counterType] */
    int ecc, ecc_pending;
    unsigned long long ecc_count[2][2];
    int page_retirement, retired_pending;
    unsigned int retired[2]; /* nvmlPageRetirementCause_t 0 / 1 */
    int row_remapping;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failed;
    int nvlinks;
    fake_nvlink_t nvlink[FAKE_MAX_NVLINKS];
    long long pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pcie_replays; /* UNSET: not supported */
    int n_fields;
    fake_field_t fields[FAKE_MAX_FIELDS];
    int violation_set[FAKE_VIOLATION_POLICIES];
    unsigned long long violation_ns[FAKE_VIOLATION_POLICIES];
    long long samples_period_ms; /* <= 0: nvmlDeviceGetSamples not supported */
    long long samples_capacity;
    int pattern_len[FAKE_SAMPLE_TYPES];
    int samples_rc[FAKE_SAMPLE_TYPES]; /* samples.rc.<type>: that sampling type's own answer */
    unsigned int pattern[FAKE_SAMPLE_TYPES][FAKE_MAX_PATTERN];
    /* GPM: gpm=1 Hopper and newer */
    int gpm;
    fake_gpm_t gpm_dev;                /* gpm.<id>, gpm_rc.<id> */
    fake_gpm_t gpm_gi[FAKE_MAX_GI];    /* gi.<gi>.gpm.<id>, gi.<gi>.gpm_rc.<id> */
    int rc_all;
    int rc[FN_COUNT];
    long delay_us[FN_COUNT]; /* microseconds: delay_ms.* and delay_us.* keys */
} fake_gpu_t;

/* Handles are pointers into this array; the struct itself is opaque to callers. */
struct nvmlDevice_st {
    int index;
};
static struct nvmlDevice_st g_handles[MAX_GPUS];
/* MIG handles: slot parent * FAKE_MAX_MIG + i of an array of their own, so handle_index()
 * never takes one for a GPU and every call that does not know MIG handles answers
 * INVALID_ARGUMENT for them without touching them. */
static struct nvmlDevice_st g_mig_handles[MAX_GPUS * FAKE_MAX_MIG];

static struct {
    int init_rc;
    int count;
    char driver[80], nvml_version[80];
    int cuda_version;
    int rc[FN_COUNT];
    long delay_us[FN_COUNT]; /* microseconds: delay_ms.* and delay_us.* keys */
    fake_gpu_t gpus[MAX_GPUS];
} g;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_init_refs;
static int g_gpm_live; /* GPM samples allocated and not yet freed */
static int g_gpm_generation; /* bumped by the last nvmlShutdown: a sample of an older one is dead */
static int g_loaded;               /* 0 never, 1 from file, 2 defaults (no file) */
static struct stat g_scenario_st;
static int g_trace_fd = -2;
/* process_util entries without @ts: g_load_us + position. g_load_us is the realtime clock at
 * the reload, pushed past g_putil_high (the newest such stamp handed out before) so a
 * rewritten scenario always answers newer samples, even within microseconds. */
static unsigned long long g_load_us, g_putil_high;

/* Event sets and injected XIDs live in fake_events.c (included at the end). Hooks: */
static int events_gpu_key(int idx, const char *k, const char *v); /* gpu.<i>.<k>: 1 = handled */
static int events_key(const char *k, const char *v);              /* top-level key: 1 = handled */
static void events_defaults(void);     /* per-reload defaults (before the file is parsed) */
static void events_after_reload(void); /* after the file was parsed: deliver new injected events */
static void events_on_shutdown(void);  /* the last nvmlShutdown: every event set is gone */
static void gpm_advance_all(void);     /* GPM counters run at the old rates until a reload */

static const char *const clock_names[4] = {"graphics", "sm", "memory", "video"};

static void gpu_defaults(int i, fake_gpu_t *gp) {
    free(gp->compute);
    free(gp->graphics);
    free(gp->putil);
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
    gp->minor = UNSET;
    for (int m = 0; m < FAKE_MAX_MIG; m++) gp->mig_gi_profile[m] = gp->mig_start[m] = gp->mig_size[m] = -1;
    gp->ecc = -1;
    gp->ecc_pending = UNSET;
    gp->putil_supported = 1;
    for (int l = 0; l < FAKE_MAX_NVLINKS; l++) gp->nvlink[l].active = 1;
    gp->pcie_gen = gp->pcie_gen_max = gp->pcie_width = gp->pcie_width_max = gp->pcie_replays = UNSET;
    gp->samples_period_ms = UNSET;
    gp->samples_capacity = 100;
    for (int t = 0; t < FAKE_SAMPLE_TYPES; t++) gp->samples_rc[t] = UNSET;
    gp->rc_all = UNSET;
    for (int m = 0; m < FAKE_GPM_IDS; m++) {
        gp->gpm_dev.rc[m] = UNSET;
        for (int k = 0; k < FAKE_MAX_GI; k++) gp->gpm_gi[k].rc[m] = UNSET;
    }
    gp->mig_current = gp->mig_pending = 1;
    for (int f = 0; f < FN_COUNT; f++) {
        gp->rc[f] = UNSET;
        gp->delay_us[f] = 0;
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
        g.delay_us[f] = 0;
    }
    for (int i = 0; i < MAX_GPUS; i++) gpu_defaults(i, &g.gpus[i]);
    events_defaults();
}

static int fn_id(const char *name) {
    for (int f = 0; f < FN_COUNT; f++)
        if (strcmp(fn_names[f], name) == 0) return f;
    return -1;
}

static unsigned long long clock_us(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static void warn_key(const char *key) { fprintf(stderr, "fake-nvml: ignoring unknown scenario key %s\n", key); }

static unsigned long long num(const char *v) { return strtoull(v, NULL, 0); }

static void copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src); }

/* Entries of a comma-separated list (an upper bound: empty ones count too). */
static int list_entries(const char *v) {
    int n = *v ? 1 : 0;
    for (const char *p = v; *p; p++) n += *p == ',';
    return n;
}

/* "pid:bytes,pid:na,pid" into a fresh *out (the old list freed) -> count; na: memory unknown */
static int parse_procs(const char *v, fake_proc_t **out, const char *full) {
    free(*out);
    *out = NULL;
    int cap = list_entries(v);
    if (cap > MAX_PROCS) {
        warn_key(full); /* more than the fake holds: the first MAX_PROCS are kept */
        cap = MAX_PROCS;
    }
    if (cap == 0 || !(*out = calloc((size_t)cap, sizeof **out))) return 0;
    int n = 0;
    const char *p = v;
    while (*p && n < cap) {
        char *end;
        unsigned long pid = strtoul(p, &end, 0);
        if (end == p) break;
        unsigned long long mem = 0;
        if (end[0] == ':' && end[1] == 'n' && end[2] == 'a') {
            mem = MEM_NOT_AVAILABLE;
            end += 3;
        } else if (*end == ':') mem = strtoull(end + 1, &end, 0);
        (*out)[n].pid = (unsigned int)pid;
        (*out)[n].mem = mem;
        n++;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

/* "pid:sm:mem:enc:dec[@ts_us],..." into a fresh gp->putil. An entry without @ts is stamped
 * g_load_us + its position. A malformed entry: warned about, the key ignored (no samples). */
static void parse_putil(fake_gpu_t *gp, const char *v, const char *full) {
    free(gp->putil);
    gp->putil = NULL;
    gp->n_putil = 0;
    int cap = list_entries(v);
    if (cap > FAKE_MAX_PUTIL) {
        warn_key(full); /* the first FAKE_MAX_PUTIL are kept */
        cap = FAKE_MAX_PUTIL;
    }
    if (cap == 0 || !(gp->putil = calloc((size_t)cap, sizeof *gp->putil))) return;
    int n = 0;
    unsigned long long high = 0;
    const char *p = v;
    while (*p && n < cap) {
        unsigned long long f[5];
        char *end;
        for (int j = 0; j < 5; j++) {
            f[j] = strtoull(p, &end, 0);
            if (end == p || (j < 4 && *end != ':')) goto bad;
            p = end + (j < 4);
        }
        unsigned long long ts = g_load_us + (unsigned long long)n;
        if (*p == '@') {
            ts = strtoull(p + 1, &end, 0);
            if (end == p + 1) goto bad;
            p = end;
        } else if (ts > high) high = ts;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) goto bad;
        while (*p == ' ') p++;
        nvmlProcessUtilizationSample_t *s = &gp->putil[n++];
        s->pid = (unsigned int)f[0];
        s->timeStamp = ts;
        s->smUtil = (unsigned int)f[1];
        s->memUtil = (unsigned int)f[2];
        s->encUtil = (unsigned int)f[3];
        s->decUtil = (unsigned int)f[4];
    }
    gp->n_putil = n;
    if (high > g_putil_high) g_putil_high = high;
    return;
bad:
    warn_key(full);
    free(gp->putil);
    gp->putil = NULL;
}

/* "MIG-a,MIG-b" (empty: MIG mode on, no MIG device). Too many or too long: warned about. */
static void parse_mig(fake_gpu_t *gp, const char *v, const char *full) {
    gp->mig_enabled = 1;
    gp->n_mig = 0;
    const char *p = v;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, ", ");
        if (len == 0) break;
        if (gp->n_mig >= FAKE_MAX_MIG || len >= FAKE_UUID_LEN) {
            warn_key(full);
            return;
        }
        memcpy(gp->mig_uuid[gp->n_mig], p, len);
        gp->mig_uuid[gp->n_mig][len] = '\0';
        gp->n_mig++;
        p += len;
    }
}

/* rc.<symbol>, delay_ms.<symbol>, delay_us.<symbol> (microseconds: simulated driver latency;
 * <symbol> "all": every call): return 1 when handled */
static int parse_override(const char *key, const char *val, int *rc, long *delay) {
    if (strncmp(key, "rc.", 3) == 0) {
        int f = fn_id(key + 3);
        if (f < 0) return 0;
        rc[f] = (int)num(val);
        return 1;
    }
    long scale = 0;
    if (strncmp(key, "delay_ms.", 9) == 0) scale = 1000;
    else if (strncmp(key, "delay_us.", 9) == 0) scale = 1;
    if (scale) {
        if (strcmp(key + 9, "all") == 0) {
            for (int f = 0; f < FN_COUNT; f++) delay[f] = (long)num(val) * scale;
            return 1;
        }
        int f = fn_id(key + 9);
        if (f < 0) return 0;
        delay[f] = (long)num(val) * scale;
        return 1;
    }
    return 0;
}

/* ---- health keys (tests/fakenvml.py documents them) ---- */

static int name_index(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

static const char *const nvlink_counter_names[FAKE_NVLINK_COUNTERS] = {"replay", "recovery", "crc_flit", "crc_data",
                                                                       "ecc_data"};
/* samples.<type>: index = nvmlSamplingType_t */
static const char *const sample_type_names[FAKE_SAMPLE_TYPES] = {"", "gpu", "memory", "encoder", "decoder"};

/* The entry for field <id> at <scope> (any_scope: the plain key); created when missing. */
static fake_field_t *field_slot(fake_gpu_t *gp, unsigned int id, int any_scope, unsigned int scope) {
    for (int i = 0; i < gp->n_fields; i++) {
        fake_field_t *f = &gp->fields[i];
        if (f->id == id && f->any_scope == any_scope && (any_scope || f->scope == scope)) return f;
    }
    if (gp->n_fields >= FAKE_MAX_FIELDS) return NULL;
    fake_field_t *f = &gp->fields[gp->n_fields++];
    memset(f, 0, sizeof(*f));
    f->id = id;
    f->scope = scope;
    f->any_scope = any_scope;
    f->type = UNSET;
    f->rc = UNSET;
    return f;
}

/* "<id>" or "<id>@<scope>" after a field*. prefix */
static fake_field_t *field_key(fake_gpu_t *gp, const char *spec) {
    char *end;
    unsigned long id = strtoul(spec, &end, 10);
    if (end == spec) return NULL;
    if (*end == '\0') return field_slot(gp, (unsigned int)id, 1, 0);
    if (*end != '@') return NULL;
    const char *s = end + 1;
    unsigned long long scope = strtoull(s, &end, 0);
    if (end == s || *end != '\0' || scope > 0xFFFFFFFFULL) return NULL;
    return field_slot(gp, (unsigned int)id, 0, (unsigned int)scope);
}

/* "v0,v1,..." -> count */
static int parse_pattern(const char *v, unsigned int *out) {
    int n = 0;
    const char *p = v;
    while (*p && n < FAKE_MAX_PATTERN) {
        char *end;
        unsigned long x = strtoul(p, &end, 0);
        if (end == p) break;
        out[n++] = (unsigned int)x;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

/* 1 when k is a health key (handled, or malformed and warned about) */
static int parse_health_key(fake_gpu_t *gp, const char *k, const char *v, const char *full) {
    if (strcmp(k, "ecc") == 0) {
        if (strcmp(v, "none") == 0) gp->ecc = -1;
        else if (strcmp(v, "on") == 0) gp->ecc = 1;
        else if (strcmp(v, "off") == 0) gp->ecc = 0;
        else warn_key(full);
    } else if (strcmp(k, "ecc_pending") == 0) gp->ecc_pending = num(v) ? 1 : 0;
    else if (strncmp(k, "ecc.", 4) == 0) {
        static const char *const types[2] = {"corrected", "uncorrected"}, *const counters[2] = {"volatile", "aggregate"};
        char a[32], b[32];
        int t = -1, c = -1;
        if (sscanf(k + 4, "%31[^.].%31s", a, b) == 2) {
            t = name_index(a, types, 2);
            c = name_index(b, counters, 2);
        }
        if (t < 0 || c < 0) warn_key(full);
        else gp->ecc_count[t][c] = num(v);
    } else if (strcmp(k, "page_retirement") == 0) gp->page_retirement = num(v) ? 1 : 0;
    else if (strcmp(k, "retired.multiple_single_bit") == 0) gp->retired[0] = (unsigned int)num(v);
    else if (strcmp(k, "retired.double_bit") == 0) gp->retired[1] = (unsigned int)num(v);
    else if (strcmp(k, "retired_pending") == 0) gp->retired_pending = num(v) ? 1 : 0;
    else if (strcmp(k, "row_remapping") == 0) gp->row_remapping = num(v) ? 1 : 0;
    else if (strcmp(k, "remapped.correctable") == 0) gp->remap_corr = (unsigned int)num(v);
    else if (strcmp(k, "remapped.uncorrectable") == 0) gp->remap_unc = (unsigned int)num(v);
    else if (strcmp(k, "remap_pending") == 0) gp->remap_pending = num(v) ? 1 : 0;
    else if (strcmp(k, "remap_failed") == 0) gp->remap_failed = num(v) ? 1 : 0;
    else if (strcmp(k, "nvlinks") == 0) {
        unsigned long long n = num(v);
        if (n > FAKE_MAX_NVLINKS) warn_key(full);
        gp->nvlinks = n > FAKE_MAX_NVLINKS ? FAKE_MAX_NVLINKS : (int)n;
    } else if (strncmp(k, "nvlink.", 7) == 0) {
        char *end;
        unsigned long l = strtoul(k + 7, &end, 10);
        if (end == k + 7 || *end != '.' || l >= FAKE_MAX_NVLINKS) {
            warn_key(full);
            return 1;
        }
        fake_nvlink_t *lk = &gp->nvlink[l];
        const char *what = end + 1;
        int c;
        if (strcmp(what, "active") == 0) lk->active = num(v) ? 1 : 0;
        else if (strcmp(what, "tx_kib") == 0) lk->tx_kib = num(v);
        else if (strcmp(what, "rx_kib") == 0) lk->rx_kib = num(v);
        else if (strncmp(what, "errors.", 7) == 0 &&
                 (c = name_index(what + 7, nvlink_counter_names, FAKE_NVLINK_COUNTERS)) >= 0)
            lk->errors[c] = num(v);
        else warn_key(full);
    } else if (strcmp(k, "pcie_gen") == 0) gp->pcie_gen = (long long)num(v);
    else if (strcmp(k, "pcie_gen_max") == 0) gp->pcie_gen_max = (long long)num(v);
    else if (strcmp(k, "pcie_width") == 0) gp->pcie_width = (long long)num(v);
    else if (strcmp(k, "pcie_width_max") == 0) gp->pcie_width_max = (long long)num(v);
    else if (strcmp(k, "pcie_replays") == 0) gp->pcie_replays = (long long)num(v);
    else if (strncmp(k, "field.", 6) == 0 || strncmp(k, "field_double.", 13) == 0 ||
             strncmp(k, "field_type.", 11) == 0 || strncmp(k, "field_rc.", 9) == 0) {
        const char *dot = strchr(k, '.');
        fake_field_t *f = field_key(gp, dot + 1);
        if (!f) {
            warn_key(full);
            return 1;
        }
        size_t prefix = (size_t)(dot - k);
        if (prefix == 5) { /* field */
            f->kind = 1;
            f->u = num(v);
        } else if (prefix == 12) { /* field_double */
            f->kind = 2;
            f->d = strtod(v, NULL);
        } else if (prefix == 10) f->type = (int)num(v); /* field_type */
        else f->rc = (int)num(v);                        /* field_rc */
    } else if (strncmp(k, "violation.", 10) == 0) {
        char *end;
        unsigned long p = strtoul(k + 10, &end, 10);
        if (end == k + 10 || *end != '\0' || p >= FAKE_VIOLATION_POLICIES) {
            warn_key(full);
            return 1;
        }
        gp->violation_set[p] = 1;
        gp->violation_ns[p] = num(v);
    } else if (strcmp(k, "samples.period_ms") == 0) gp->samples_period_ms = (long long)num(v);
    else if (strcmp(k, "samples.capacity") == 0) gp->samples_capacity = (long long)num(v);
    else if (strncmp(k, "samples.rc.", 11) == 0) {
        int t = name_index(k + 11, sample_type_names, FAKE_SAMPLE_TYPES);
        if (t <= 0) warn_key(full);
        else gp->samples_rc[t] = (int)num(v);
    } else if (strncmp(k, "samples.", 8) == 0) {
        int t = name_index(k + 8, sample_type_names, FAKE_SAMPLE_TYPES);
        if (t <= 0) warn_key(full);
        else gp->pattern_len[t] = parse_pattern(v, gp->pattern[t]);
    } else return 0;
    return 1;
}

/* gpm.<id>=<value|nan|window> and gpm_rc.<id>=<rc> into one source: 1 when k is such a key */
static int parse_gpm_value(fake_gpm_t *src, const char *k, const char *v, const char *full) {
    int is_rc = strncmp(k, "gpm_rc.", 7) == 0;
    if (!is_rc && strncmp(k, "gpm.", 4) != 0) return 0;
    const char *spec = k + (is_rc ? 7 : 4);
    char *end;
    unsigned long id = strtoul(spec, &end, 10);
    if (end == spec || *end != '\0' || id >= FAKE_GPM_IDS) {
        warn_key(full);
        return 1;
    }
    if (is_rc) {
        src->rc[id] = (int)strtol(v, NULL, 0);
        return 1;
    }
    if (strcasecmp(v, "nan") == 0) src->set[id] = 2;
    else if (strcmp(v, "window") == 0) src->set[id] = 3;
    else {
        char *e;
        double x = strtod(v, &e);
        if (e == v || x < 0) {
            warn_key(full);
            return 1;
        }
        src->set[id] = 1;
        src->milli[id] = (long long)(x * 1000.0 + 0.5); /* integer milli-units: exact deltas */
    }
    return 1;
}

/* gpm=0|1, gpm.*, gpm_rc.*, gi.<gi>.gpm.*: 1 when k is a GPM key */
static int parse_gpm_key(fake_gpu_t *gp, const char *k, const char *v, const char *full) {
    if (strcmp(k, "gpm") == 0) {
        gp->gpm = num(v) ? 1 : 0;
        return 1;
    }
    if (strncmp(k, "gi.", 3) == 0) {
        char *end;
        unsigned long gi = strtoul(k + 3, &end, 10);
        if (end == k + 3 || *end != '.' || gi >= FAKE_MAX_GI || !parse_gpm_value(&gp->gpm_gi[gi], end + 1, v, full))
            warn_key(full);
        return 1;
    }
    return parse_gpm_value(&gp->gpm_dev, k, v, full);
}

/* mig_devices=<gi>:<ci>:<profile>:<uuid>:<mem_total>:<mem_used>[:<gi profile id>:<placement
 * start>[:<size>]]|empty|invalid,... (MIG on; empty: MIG on, no slot); mig_mode=<current>:<pending>
 * (a MIG-capable GPU, default 1:1) */
static void parse_mig_devices(fake_gpu_t *gp, const char *v, const char *full) {
    gp->mig_enabled = 1;
    gp->mig_detail = 1;
    gp->n_mig = 0;
    const char *p = v;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, ",");
        if (len == 0) break;
        char entry[256];
        if (gp->n_mig >= FAKE_MAX_MIG || len >= sizeof entry) goto bad;
        memcpy(entry, p, len);
        entry[len] = '\0';
        int n = gp->n_mig;
        if (strcmp(entry, "empty") == 0) gp->mig_slot_rc[n] = NVML_ERROR_NOT_FOUND;
        else if (strcmp(entry, "invalid") == 0) gp->mig_slot_rc[n] = NVML_ERROR_INVALID_ARGUMENT;
        else {
            char profile[32], uuid[FAKE_UUID_LEN];
            unsigned int gi, ci;
            unsigned long long total, used;
            int gi_profile = -1, start = -1, size = 1;
            int got = sscanf(entry, "%u:%u:%31[^:]:%95[^:]:%llu:%llu:%d:%d:%d", &gi, &ci, profile, uuid, &total, &used,
                             &gi_profile, &start, &size);
            if ((got != 6 && got != 8 && got != 9) || gi >= FAKE_MAX_GI || (got >= 8 && (gi_profile < 0 || start < 0)))
                goto bad;
            gp->mig_gi_profile[n] = got >= 8 ? gi_profile : -1;
            gp->mig_start[n] = got >= 8 ? start : -1;
            gp->mig_size[n] = got >= 8 ? size : -1;
            gp->mig_slot_rc[n] = NVML_SUCCESS;
            gp->mig_gi[n] = gi;
            gp->mig_ci[n] = ci;
            copy(gp->mig_profile[n], sizeof gp->mig_profile[n], profile);
            copy(gp->mig_uuid[n], sizeof gp->mig_uuid[n], uuid);
            gp->mig_mem_total[n] = total;
            gp->mig_mem_used[n] = used;
        }
        gp->n_mig++;
        p += len;
    }
    return;
bad:
    warn_key(full);
    gp->n_mig = 0;
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
    else if (strcmp(k, "minor") == 0) gp->minor = (long long)num(v);
    else if (strcmp(k, "cuda_cc") == 0) sscanf(v, "%d.%d", &gp->cc_major, &gp->cc_minor);
    else if (strcmp(k, "processes") == 0) gp->n_compute = parse_procs(v, &gp->compute, full);
    else if (strcmp(k, "graphics_processes") == 0) gp->n_graphics = parse_procs(v, &gp->graphics, full);
    else if (strcmp(k, "process_util") == 0) parse_putil(gp, v, full);
    else if (strcmp(k, "process_util_supported") == 0) gp->putil_supported = num(v) ? 1 : 0;
    else if (strcmp(k, "mig_uuids") == 0) parse_mig(gp, v, full);
    else if (strcmp(k, "mig_devices") == 0) parse_mig_devices(gp, v, full);
    else if (strcmp(k, "mig_mode") == 0) {
        gp->mig_enabled = 1;
        if (sscanf(v, "%d:%d", &gp->mig_current, &gp->mig_pending) != 2) warn_key(full);
    }
    else if (strcmp(k, "rc.all") == 0) gp->rc_all = (int)num(v);
    else if (parse_gpm_key(gp, k, v, full)) {}
    else if (parse_health_key(gp, k, v, full)) {}
    else if (strncmp(k, "clock.", 6) == 0 || strncmp(k, "max_clock.", 10) == 0) {
        int is_max = k[0] == 'm';
        const char *which = strchr(k, '.') + 1;
        for (int c = 0; c < 4; c++)
            if (strcmp(which, clock_names[c]) == 0) {
                (is_max ? gp->max_clock : gp->clock)[c] = (unsigned int)num(v);
                return;
            }
        warn_key(full);
    } else if (!parse_override(k, v, gp->rc, gp->delay_us) && !events_gpu_key((int)(gp - g.gpus), k, v))
        warn_key(full);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static void parse_file(FILE *f) {
    char *line = NULL; /* any length: 512 processes or 1024 samples make lines of tens of KiB */
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
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
        else if (!parse_override(key, val, g.rc, g.delay_us) && !events_key(key, val)) warn_key(key);
    }
    free(line);
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
    gpm_advance_all();
    set_defaults();
    g_load_us = clock_us(CLOCK_REALTIME);
    if (g_load_us <= g_putil_high) g_load_us = g_putil_high + 1;
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

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000L, (us % 1000000L) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int handle_index(nvmlDevice_t dev) {
    if (dev < g_handles || dev >= g_handles + MAX_GPUS) return -1;
    return (int)(dev - g_handles);
}

/* The slot (parent in *parent) of a MIG handle; -1 for anything else. By address, so a
 * GPU handle or a bogus pointer is never read. */
static int mig_slot(nvmlDevice_t dev, int *parent) {
    uintptr_t a = (uintptr_t)dev, base = (uintptr_t)g_mig_handles;
    if (a < base || a >= base + sizeof g_mig_handles || (a - base) % sizeof g_mig_handles[0]) return -1;
    size_t k = (a - base) / sizeof g_mig_handles[0];
    *parent = (int)(k / FAKE_MAX_MIG);
    return (int)(k % FAKE_MAX_MIG);
}

/* Slots GetMaxMigDeviceCount reports: none while MIG mode is off. */
static int mig_slots(const fake_gpu_t *gp) { return gp->mig_enabled && gp->mig_current ? gp->n_mig : 0; }

/* MIG on with mig_devices: the parent refuses what a MIG-mode GPU refuses (utilization,
 * encoder, decoder, sample buffers, process utilization). */
static int mig_refuses(const fake_gpu_t *gp) { return gp->mig_detail && gp->mig_current; }

static int override_rc(int fn, int idx) {
    if (idx >= 0) {
        const fake_gpu_t *gp = &g.gpus[idx];
        if (gp->rc_all != UNSET) return gp->rc_all;
        if (gp->rc[fn] != UNSET) return gp->rc[fn];
    }
    return g.rc[fn] != UNSET ? g.rc[fn] : NVML_SUCCESS;
}

/* What the overrides of symbol fn (gpu.<i>.rc.<fn>, then rc.<fn>) make that call return on gp,
 * without tracing or delaying it: a field read answers as the direct call would, yet stays one
 * nvmlDeviceGetFieldValues call. g_mu held. */
static nvmlReturn_t symbol_rc(const fake_gpu_t *gp, int fn) {
    return (nvmlReturn_t)override_rc(fn, (int)(gp - g.gpus));
}

/* Entry of every call. Returns with g_mu held; the delay is slept outside the lock so a
 * "wedged" call does not stop other threads. idx < 0: not a device call. */
static nvmlReturn_t enter(int fn, int idx, int needs_init) {
    pthread_mutex_lock(&g_mu);
    maybe_reload();
    trace(fn, idx);
    long delay = g.delay_us[fn];
    if (idx >= 0 && idx < MAX_GPUS && g.gpus[idx].delay_us[fn]) delay = g.gpus[idx].delay_us[fn];
    if (delay > 0) {
        pthread_mutex_unlock(&g_mu);
        sleep_us(delay);
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

/* Entry of a call made with a MIG handle: traced and overridden as its parent GPU, g_mu held on
 * return. A handle whose MIG device is gone since (fewer mig_uuids or GPUs after a reload) is
 * INVALID_ARGUMENT, like the handle of a destroyed compute instance. */
static nvmlReturn_t mig_enter(int fn, int parent, int slot) {
    nvmlReturn_t rc = enter(fn, parent, 1);
    if (rc == NVML_SUCCESS && (parent >= g.count || slot >= mig_slots(&g.gpus[parent]) || g.gpus[parent].mig_slot_rc[slot] != NVML_SUCCESS))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    return rc;
}

/* A MIG handle of a mig_devices slot (with ids, profile and memory): its parent, else -1
 * (g_mu held; *rc the answer when -1 is returned for a MIG handle, or left for a GPU handle). */
static int mig_detail_enter(int fn, nvmlDevice_t device, int *slot, nvmlReturn_t *rc) {
    int parent;
    *slot = mig_slot(device, &parent);
    if (*slot < 0) return -1;
    *rc = mig_enter(fn, parent, *slot);
    if (*rc == NVML_SUCCESS && !g.gpus[parent].mig_detail) *rc = NVML_ERROR_INVALID_ARGUMENT; /* mig_uuids only */
    return *rc == NVML_SUCCESS ? parent : -1;
}

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
    if (--g_init_refs == 0) {
        events_on_shutdown();
        if (g_gpm_live > 0) fprintf(stderr, "fake-nvml: %d GPM samples still allocated at nvmlShutdown\n", g_gpm_live);
        g_gpm_generation++;
    }
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch ((int)result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
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
    *minor = gp->minor == UNSET ? (unsigned int)idx_ : (unsigned int)gp->minor;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int slot, parent;
    nvmlReturn_t mrc;
    if ((parent = mig_detail_enter(FN_nvmlDeviceGetName, device, &slot, &mrc)) >= 0) {
        char full[160];
        snprintf(full, sizeof full, "%s MIG %s", g.gpus[parent].name, g.gpus[parent].mig_profile[slot]);
        return leave(copy_out(name, length, full));
    }
    if (slot >= 0) return leave(mrc);
    DEV_ENTER(nvmlDeviceGetName);
    return leave(copy_out(name, length, gp->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int parent, slot = mig_slot(device, &parent);
    if (slot >= 0) { /* a MIG device: its own MIG-... uuid */
        nvmlReturn_t rc = mig_enter(FN_nvmlDeviceGetUUID, parent, slot);
        return leave(rc != NVML_SUCCESS ? rc : copy_out(uuid, length, g.gpus[parent].mig_uuid[slot]));
    }
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
    int slot, parent;
    nvmlReturn_t mrc;
    if ((parent = mig_detail_enter(FN_nvmlDeviceGetMemoryInfo, device, &slot, &mrc)) >= 0) {
        const fake_gpu_t *pg = &g.gpus[parent];
        if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
        memory->total = pg->mig_mem_total[slot];
        memory->used = pg->mig_mem_used[slot];
        memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
        return leave(NVML_SUCCESS);
    }
    if (slot >= 0) return leave(mrc);
    DEV_ENTER(nvmlDeviceGetMemoryInfo);
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = gp->mem_total;
    memory->free = mem_free(gp);
    memory->used = gp->mem_used + gp->mem_reserved;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    int slot, parent;
    nvmlReturn_t mrc;
    if ((parent = mig_detail_enter(FN_nvmlDeviceGetMemoryInfo_v2, device, &slot, &mrc)) >= 0) {
        const fake_gpu_t *pg = &g.gpus[parent];
        if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
        if (memory->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        memory->total = pg->mig_mem_total[slot];
        memory->reserved = 0;
        memory->used = pg->mig_mem_used[slot];
        memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
        return leave(NVML_SUCCESS);
    }
    if (slot >= 0) return leave(mrc);
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
    int slot, parent;
    nvmlReturn_t mrc;
    if ((parent = mig_detail_enter(FN_nvmlDeviceGetBAR1MemoryInfo, device, &slot, &mrc)) >= 0) {
        if (!bar1) return leave(NVML_ERROR_INVALID_ARGUMENT);
        bar1->bar1Total = 33554432ULL; /* a MIG device's share of the BAR1 aperture (nvitop shows it) */
        bar1->bar1Used = 1048576ULL;
        bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
        return leave(NVML_SUCCESS);
    }
    if (slot >= 0) return leave(mrc);
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
    if (mig_refuses(gp)) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!u) return leave(NVML_ERROR_INVALID_ARGUMENT);
    u->gpu = gp->util_gpu;
    u->memory = gp->util_mem;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    DEV_ENTER(nvmlDeviceGetEncoderUtilization);
    if (mig_refuses(gp)) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!utilization || !samplingPeriodUs) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *utilization = gp->enc_util;
    *samplingPeriodUs = 167000;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    DEV_ENTER(nvmlDeviceGetDecoderUtilization);
    if (mig_refuses(gp)) return leave(NVML_ERROR_NOT_SUPPORTED);
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

/* Only the samples newer than lastSeenTimeStamp, in the scenario's order. None: NOT_FOUND with
 * count 0 (also for the size query: pynvml then raises NotFound); NULL buffer or too small a
 * count: INSUFFICIENT_SIZE with the count needed (the only answer pynvml's size query takes). */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    DEV_ENTER(nvmlDeviceGetProcessUtilization);
    if (mig_refuses(gp)) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!processSamplesCount) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!gp->putil_supported) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int newer = 0;
    for (int i = 0; i < gp->n_putil; i++) newer += gp->putil[i].timeStamp > lastSeenTimeStamp;
    if (newer == 0) {
        *processSamplesCount = 0;
        return leave(NVML_ERROR_NOT_FOUND);
    }
    if (!utilization || *processSamplesCount < newer) {
        *processSamplesCount = newer;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int n = 0;
    for (int i = 0; i < gp->n_putil; i++)
        if (gp->putil[i].timeStamp > lastSeenTimeStamp) utilization[n++] = gp->putil[i];
    *processSamplesCount = n;
    return leave(NVML_SUCCESS);
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

/* ---- MIG: without mig_uuids a board that has no MIG (NOT_SUPPORTED, as before) ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEV_ENTER(nvmlDeviceGetMigMode);
    if (!gp->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!currentMode || !pendingMode) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = (unsigned int)gp->mig_current;
    *pendingMode = (unsigned int)gp->mig_pending;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    int parent, slot = mig_slot(device, &parent);
    if (slot >= 0) {
        nvmlReturn_t rc = mig_enter(FN_nvmlDeviceIsMigDeviceHandle, parent, slot);
        if (rc == NVML_SUCCESS && !isMigDevice) rc = NVML_ERROR_INVALID_ARGUMENT;
        if (rc == NVML_SUCCESS) *isMigDevice = 1;
        return leave(rc);
    }
    DEV_ENTER(nvmlDeviceIsMigDeviceHandle);
    if (!isMigDevice) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = 0;
    return leave(NVML_SUCCESS);
}

/* The number of mig_uuids. (A real driver answers "the maximum number of MIG devices that can
 * exist" (nvml.h), 7 on an H100, and NOT_FOUND for the indexes without one; the fake's index
 * range is exactly the configured devices, NOT_FOUND past them.) */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEV_ENTER(nvmlDeviceGetMaxMigDeviceCount);
    if (!gp->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)mig_slots(gp);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    DEV_ENTER(nvmlDeviceGetMigDeviceHandleByIndex); /* a MIG handle as the parent: INVALID_ARGUMENT */
    if (!gp->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!migDevice) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned int)mig_slots(gp)) return leave(NVML_ERROR_NOT_FOUND);
    if (gp->mig_slot_rc[index] != NVML_SUCCESS) return leave(gp->mig_slot_rc[index]); /* an empty slot */
    struct nvmlDevice_st *h = &g_mig_handles[idx_ * FAKE_MAX_MIG + (int)index];
    h->index = idx_;
    *migDevice = h;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    int parent, slot = mig_slot(migDevice, &parent);
    if (slot < 0) { /* a GPU handle (or garbage) is no MIG device */
        nvmlReturn_t rc = enter(FN_nvmlDeviceGetDeviceHandleFromMigDeviceHandle, handle_index(migDevice), 1);
        return leave(rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT);
    }
    nvmlReturn_t rc = mig_enter(FN_nvmlDeviceGetDeviceHandleFromMigDeviceHandle, parent, slot);
    if (rc == NVML_SUCCESS && !device) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        g_handles[parent].index = parent;
        *device = &g_handles[parent]; /* the very handle nvmlDeviceGetHandleByIndex gives */
    }
    return leave(rc);
}

/* GPU / compute instance ids: MIG handles of mig_devices slots only */
static nvmlReturn_t instance_id(int fn, nvmlDevice_t device, unsigned int *id, int compute) {
    int slot, parent;
    nvmlReturn_t rc;
    if ((parent = mig_detail_enter(fn, device, &slot, &rc)) >= 0) {
        if (!id) return leave(NVML_ERROR_INVALID_ARGUMENT);
        *id = compute ? g.gpus[parent].mig_ci[slot] : g.gpus[parent].mig_gi[slot];
        return leave(NVML_SUCCESS);
    }
    if (slot >= 0) return leave(rc);
    rc = enter(fn, handle_index(device), 1);
    return leave(rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT); /* a GPU handle is no MIG device */
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(FN_nvmlDeviceGetGpuInstanceId, device, id, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(FN_nvmlDeviceGetComputeInstanceId, device, id, 1);
}

/* GPU instance handles: parent * FAKE_MAX_GI + id of an array of their own */
struct nvmlGpuInstance_st {
    int parent;
    unsigned int id;
};
static struct nvmlGpuInstance_st g_gi_handles[MAX_GPUS * FAKE_MAX_GI];

/* the first present mig_devices slot of GPU instance id on gp, else -1 */
static int gi_slot(const fake_gpu_t *gp, unsigned int id) {
    for (int n = 0; n < mig_slots(gp); n++)
        if (gp->mig_slot_rc[n] == NVML_SUCCESS && gp->mig_gi[n] == id) return n;
    return -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    DEV_ENTER(nvmlDeviceGetGpuInstanceById); /* a MIG handle as the parent: INVALID_ARGUMENT */
    if (!gp->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!gpuInstance || id >= FAKE_MAX_GI) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!gp->mig_detail || gi_slot(gp, id) < 0) return leave(NVML_ERROR_NOT_FOUND);
    struct nvmlGpuInstance_st *h = &g_gi_handles[idx_ * FAKE_MAX_GI + (int)id];
    h->parent = idx_;
    h->id = id;
    *gpuInstance = h;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    uintptr_t a = (uintptr_t)gpuInstance, base = (uintptr_t)g_gi_handles;
    int known = a >= base && a < base + sizeof g_gi_handles && (a - base) % sizeof g_gi_handles[0] == 0;
    int parent = known ? gpuInstance->parent : -1;
    nvmlReturn_t rc = enter(FN_nvmlGpuInstanceGetInfo, parent, 1);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!known || !info || parent < 0 || parent >= g.count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    fake_gpu_t *gp = &g.gpus[parent];
    int n = gi_slot(gp, gpuInstance->id);
    if (n < 0) return leave(NVML_ERROR_INVALID_ARGUMENT); /* destroyed since: a stale handle */
    if (gp->mig_gi_profile[n] < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    g_handles[parent].index = parent;
    info->device = &g_handles[parent];
    info->id = gpuInstance->id;
    info->profileId = (unsigned int)gp->mig_gi_profile[n];
    info->placement.start = (unsigned int)gp->mig_start[n];
    info->placement.size = (unsigned int)gp->mig_size[n];
    return leave(NVML_SUCCESS);
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

/* ---- health: ECC, retired pages, remapped rows ----
 * The state behind each call is read through one helper that its field ids (field_model) use
 * too, so a field and its direct call cannot disagree. */

static nvmlReturn_t ecc_mode(const fake_gpu_t *gp, unsigned int *current, unsigned int *pending) {
    if (gp->ecc < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned int)gp->ecc;
    *pending = (unsigned int)(gp->ecc_pending == UNSET ? gp->ecc : gp->ecc_pending);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    DEV_ENTER(nvmlDeviceGetEccMode);
    if (!current || !pending) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int cur, pend;
    nvmlReturn_t rc = ecc_mode(gp, &cur, &pend);
    if (rc == NVML_SUCCESS) {
        *current = (nvmlEnableState_t)cur;
        *pending = (nvmlEnableState_t)pend;
    }
    return leave(rc);
}

/* Counters answer only while ECC is on (a board without ECC, or with it off: NOT_SUPPORTED).
 * errorType and counterType are 0 or 1 here. */
static nvmlReturn_t ecc_total(const fake_gpu_t *gp, unsigned int errorType, unsigned int counterType,
                              unsigned long long *out) {
    if (gp->ecc != 1) return NVML_ERROR_NOT_SUPPORTED;
    *out = gp->ecc_count[errorType][counterType];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEV_ENTER(nvmlDeviceGetTotalEccErrors);
    if (!eccCounts || (unsigned int)errorType > 1 || (unsigned int)counterType > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(ecc_total(gp, (unsigned int)errorType, (unsigned int)counterType, eccCounts));
}

/* Retired pages and their pending status: NOT_SUPPORTED without page_retirement. */
static nvmlReturn_t retirement_check(const fake_gpu_t *gp) {
    return gp->page_retirement ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* Page j retired for cause c: address ((c + 1) << 36) | (j << 12), timestamp 1700000000 + j. */
static nvmlReturn_t retired_pages(const fake_gpu_t *gp, nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps, int v2) {
    if (!pageCount || (unsigned int)cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = retirement_check(gp);
    if (rc != NVML_SUCCESS) return rc;
    unsigned int n = gp->retired[cause];
    if (*pageCount == 0 && !addresses) { /* the size query */
        *pageCount = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (*pageCount < n) {
        *pageCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (!addresses || (v2 && !timestamps)) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int j = 0; j < n; j++) {
        addresses[j] = ((unsigned long long)cause + 1) << 36 | (unsigned long long)j << 12;
        if (v2) timestamps[j] = 1700000000ULL + j;
    }
    *pageCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                              unsigned int *pageCount, unsigned long long *addresses) {
    DEV_ENTER(nvmlDeviceGetRetiredPages);
    return leave(retired_pages(gp, cause, pageCount, addresses, NULL, 0));
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                 unsigned int *pageCount, unsigned long long *addresses,
                                                 unsigned long long *timestamps) {
    DEV_ENTER(nvmlDeviceGetRetiredPages_v2);
    return leave(retired_pages(gp, cause, pageCount, addresses, timestamps, 1));
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    DEV_ENTER(nvmlDeviceGetRetiredPagesPendingStatus);
    if (!isPending) return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = retirement_check(gp);
    if (rc == NVML_SUCCESS) *isPending = (nvmlEnableState_t)gp->retired_pending;
    return leave(rc);
}

/* rows[4]: correctable, uncorrectable, pending, failure (the call's outputs in order) */
static nvmlReturn_t remapped_rows(const fake_gpu_t *gp, unsigned int rows[4]) {
    if (!gp->row_remapping) return NVML_ERROR_NOT_SUPPORTED;
    rows[0] = gp->remap_corr;
    rows[1] = gp->remap_unc;
    rows[2] = gp->remap_pending;
    rows[3] = gp->remap_failed;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred) {
    DEV_ENTER(nvmlDeviceGetRemappedRows);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int rows[4];
    nvmlReturn_t rc = remapped_rows(gp, rows);
    if (rc == NVML_SUCCESS) {
        *corrRows = rows[0];
        *uncRows = rows[1];
        *isPending = rows[2];
        *failureOccurred = rows[3];
    }
    return leave(rc);
}

/* ---- health: NVLink, PCIe link ---- */

/* NOT_SUPPORTED without links, INVALID_ARGUMENT for a link past the last one */
static nvmlReturn_t nvlink_check(const fake_gpu_t *gp, unsigned int link) {
    if (gp->nvlinks <= 0) return NVML_ERROR_NOT_SUPPORTED;
    return link >= (unsigned int)gp->nvlinks ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

static nvmlReturn_t nvlink_state(const fake_gpu_t *gp, unsigned int link, unsigned int *active) {
    nvmlReturn_t rc = nvlink_check(gp, link);
    if (rc == NVML_SUCCESS) *active = (unsigned int)gp->nvlink[link].active;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    DEV_ENTER(nvmlDeviceGetNvLinkState);
    if (!isActive) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int active;
    nvmlReturn_t rc = nvlink_state(gp, link, &active);
    if (rc == NVML_SUCCESS) *isActive = (nvmlEnableState_t)active;
    return leave(rc);
}

/* counter: nvmlNvLinkErrorCounter_t (0 replay, 1 recovery, 2 crc_flit, 3 crc_data, 4 ecc_data) */
static nvmlReturn_t nvlink_error(const fake_gpu_t *gp, unsigned int link, unsigned int counter,
                                 unsigned long long *out) {
    nvmlReturn_t rc = nvlink_check(gp, link);
    if (rc == NVML_SUCCESS && counter >= FAKE_NVLINK_COUNTERS) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) *out = gp->nvlink[link].errors[counter];
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue) {
    DEV_ENTER(nvmlDeviceGetNvLinkErrorCounter);
    if (!counterValue) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(nvlink_error(gp, link, (unsigned int)counter, counterValue));
}

/* Each PCIe key unset: that call NOT_SUPPORTED. */
static nvmlReturn_t opt_uint(long long value, unsigned int *out) {
    if (value == UNSET) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)value;
    return NVML_SUCCESS;
}

#define OPT_UINT_GETTER(fn, field)                                                  \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {                \
        DEV_ENTER(fn);                                                              \
        if (!out) return leave(NVML_ERROR_INVALID_ARGUMENT);                        \
        return leave(opt_uint(gp->field, out));                                     \
    }

OPT_UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
OPT_UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_gen_max)
OPT_UINT_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gen_max)
OPT_UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
OPT_UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_width_max)
OPT_UINT_GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replays)

/* ---- health: field values, violation time ---- */

/* The id's natural type: how an integer field.<id> (or the modeled value) is stored and labelled. */
static int field_natural_type(unsigned int id) {
    switch (id) {
    case FIELD_ECC_CURRENT: case FIELD_ECC_PENDING: case FIELD_RETIRED_PENDING: case 82:
    case FIELD_NVLINK_LINK_COUNT: case FIELD_PCIE_REPLAY_COUNTER: case FIELD_REMAPPED_COR: case 143: case 144:
    case FIELD_REMAPPED_FAILURE: case FIELD_NVLINK_GET_STATE: case FIELD_POWER_AVERAGE: case FIELD_POWER_INSTANT:
    case FIELD_POWER_CURRENT_LIMIT: case 230:
        return NVML_VALUE_TYPE_UNSIGNED_INT;
    case FIELD_GPU_TEMP:
        return NVML_VALUE_TYPE_DOUBLE; /* degrees with sub-degree precision (nvml.h) */
    default:
        return NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    }
}

static const fake_field_t *field_find(const fake_gpu_t *gp, unsigned int id, int any_scope, unsigned int scope) {
    for (int i = 0; i < gp->n_fields; i++) {
        const fake_field_t *f = &gp->fields[i];
        if (f->id == id && f->any_scope == any_scope && (any_scope || f->scope == scope)) return f;
    }
    return NULL;
}

/* NVLink throughput (138/139 DATA, 140/141 RAW; even ids TX, odd RX) from the nvlink keys. */
static nvmlReturn_t nvlink_throughput(const fake_gpu_t *gp, unsigned int id, unsigned int scope,
                                      unsigned long long *out) {
    if (gp->nvlinks <= 0) return NVML_ERROR_NOT_SUPPORTED;
    int rx = (id - FIELD_NVLINK_DATA_TX) % 2;
    if (scope == FAKE_ALL_LINKS) {
        unsigned long long sum = 0;
        for (int l = 0; l < gp->nvlinks; l++) sum += rx ? gp->nvlink[l].rx_kib : gp->nvlink[l].tx_kib;
        *out = sum;
        return NVML_SUCCESS;
    }
    if (scope >= (unsigned int)gp->nvlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *out = rx ? gp->nvlink[scope].rx_kib : gp->nvlink[scope].tx_kib;
    return NVML_SUCCESS;
}

/* The legacy per-link NVLink counters (scopeId ignored): the first id of links 0-5 and of
 * links 6-11, and the nvmlNvLinkErrorCounter_t they read. */
static const struct {
    unsigned int low, high, counter;
} nvlink_legacy_fields[] = {
    {32, 96, 2},  /* CRC_FLIT */
    {39, 102, 3}, /* CRC_DATA */
    {46, 108, 0}, /* REPLAY */
    {53, 114, 1}, /* RECOVERY */
};

/* 1 when id is a legacy per-link counter: its link and counter */
static int nvlink_legacy_field(unsigned int id, unsigned int *link, unsigned int *counter) {
    for (size_t i = 0; i < sizeof nvlink_legacy_fields / sizeof nvlink_legacy_fields[0]; i++) {
        unsigned int low = nvlink_legacy_fields[i].low, high = nvlink_legacy_fields[i].high;
        if (id >= low && id < low + 6) *link = id - low;
        else if (id >= high && id < high + 6) *link = 6 + id - high;
        else continue;
        *counter = nvlink_legacy_fields[i].counter;
        return 1;
    }
    return 0;
}

/* An id served from the state of its direct call: 1 with the entry's return in *rc and, on
 * SUCCESS, the value in *u; 0 for an id not modeled here. The call's rc.<symbol> overrides
 * decide first, as its DEV_ENTER would; its delay does not apply (the field call has its own).
 * None of these calls refuses in MIG mode (mig_refuses), so neither does its field. */
static int field_model(const fake_gpu_t *gp, unsigned int id, unsigned int scope, nvmlReturn_t *rc,
                       unsigned long long *u) {
    unsigned int v[4], link, counter;
    int fn;
    *rc = NVML_SUCCESS;
    switch (id) {
    case FIELD_ECC_CURRENT:
    case FIELD_ECC_PENDING:
        fn = FN_nvmlDeviceGetEccMode;
        if ((*rc = ecc_mode(gp, &v[0], &v[1])) == NVML_SUCCESS) *u = v[id - FIELD_ECC_CURRENT];
        break;
    case FIELD_ECC_SBE_VOL_TOTAL: case 4: case 5: case FIELD_ECC_DBE_AGG_TOTAL:
        /* 3 SBE volatile, 4 DBE volatile, 5 SBE aggregate, 6 DBE aggregate */
        fn = FN_nvmlDeviceGetTotalEccErrors;
        *rc = ecc_total(gp, (id - FIELD_ECC_SBE_VOL_TOTAL) % 2, (id - FIELD_ECC_SBE_VOL_TOTAL) / 2, u);
        break;
    case FIELD_RETIRED_SBE:
    case FIELD_RETIRED_DBE:
        fn = FN_nvmlDeviceGetRetiredPages; /* the number of pages its size query gives */
        if ((*rc = retirement_check(gp)) == NVML_SUCCESS) *u = gp->retired[id - FIELD_RETIRED_SBE];
        break;
    case FIELD_RETIRED_PENDING:
        fn = FN_nvmlDeviceGetRetiredPagesPendingStatus;
        if ((*rc = retirement_check(gp)) == NVML_SUCCESS) *u = (unsigned long long)gp->retired_pending;
        break;
    case FIELD_REMAPPED_COR: case 143: case 144: case FIELD_REMAPPED_FAILURE:
        fn = FN_nvmlDeviceGetRemappedRows;
        if ((*rc = remapped_rows(gp, v)) == NVML_SUCCESS) *u = v[id - FIELD_REMAPPED_COR];
        break;
    case FIELD_NVLINK_GET_STATE:
        fn = FN_nvmlDeviceGetNvLinkState;
        if ((*rc = nvlink_state(gp, scope, &v[0])) == NVML_SUCCESS) *u = v[0];
        break;
    case FIELD_NVLINK_DL_REPLAY: case 162: case FIELD_NVLINK_DL_CRC:
        fn = FN_nvmlDeviceGetNvLinkErrorCounter; /* counters 0 replay, 1 recovery, 2 crc_flit */
        *rc = nvlink_error(gp, scope, id - FIELD_NVLINK_DL_REPLAY, u);
        break;
    case FIELD_TOTAL_ENERGY:
        fn = FN_nvmlDeviceGetTotalEnergyConsumption;
        *u = gp->energy_mj;
        break;
    case FIELD_POWER_AVERAGE:
    case FIELD_POWER_INSTANT:
    case FIELD_POWER_CURRENT_LIMIT:
        if (scope != 0) return 0; /* scopeId 0 is the GPU; module / memory power are not modeled */
        fn = id == FIELD_POWER_CURRENT_LIMIT ? FN_nvmlDeviceGetEnforcedPowerLimit : FN_nvmlDeviceGetPowerUsage;
        *u = id == FIELD_POWER_CURRENT_LIMIT ? gp->power_limit_mw : gp->power_mw;
        break;
#ifndef FAKE_OLD_DRIVER
    case FIELD_GPU_TEMP:
        fn = FN_nvmlDeviceGetTemperatureV;
        *u = (unsigned long long)(long long)gp->temperature; /* a double in field_fill */
        break;
#endif
    case FIELD_PCIE_REPLAY_COUNTER:
        fn = FN_nvmlDeviceGetPcieReplayCounter;
        if ((*rc = opt_uint(gp->pcie_replays, &v[0])) == NVML_SUCCESS) *u = v[0];
        break;
    default:
        if (!nvlink_legacy_field(id, &link, &counter)) return 0;
        fn = FN_nvmlDeviceGetNvLinkErrorCounter;
        *rc = nvlink_error(gp, link, counter, u);
        break;
    }
    nvmlReturn_t over = symbol_rc(gp, fn);
    if (over != NVML_SUCCESS) *rc = over;
    return 1;
}

/* Fill one entry: the scoped key wins over the plain one, attribute by attribute. */
static void field_fill(const fake_gpu_t *gp, nvmlFieldValue_t *e, long long now_us) {
    const fake_field_t *sc = field_find(gp, e->fieldId, 0, e->scopeId), *pl = field_find(gp, e->fieldId, 1, 0);
    const fake_field_t *val = sc && sc->kind ? sc : (pl && pl->kind ? pl : NULL);
    int rc = sc && sc->rc != UNSET ? sc->rc : (pl && pl->rc != UNSET ? pl->rc : UNSET);
    int type = sc && sc->type != UNSET ? sc->type : (pl && pl->type != UNSET ? pl->type : UNSET);
    int natural = field_natural_type(e->fieldId);
    nvmlReturn_t entry_rc = NVML_SUCCESS;
    int stored = natural;
    unsigned long long u = 0;
    double d = 0.0;

    e->timestamp = now_us;
    e->latencyUsec = 0;
    memset(&e->value, 0, sizeof(e->value));
    if (val && val->kind == 2) {
        stored = NVML_VALUE_TYPE_DOUBLE;
        d = val->d;
    } else if (val) {
        u = val->u;
        if (natural == NVML_VALUE_TYPE_DOUBLE) d = (double)u;
    } else if (field_model(gp, e->fieldId, e->scopeId, &entry_rc, &u)) {
        /* the direct call's answer (field_model) */
        if (natural == NVML_VALUE_TYPE_DOUBLE) d = (double)(long long)u;
    } else if (e->fieldId == FIELD_NVLINK_LINK_COUNT) {
        u = (unsigned long long)gp->nvlinks;
    } else if (e->fieldId >= FIELD_NVLINK_DATA_TX && e->fieldId <= FIELD_NVLINK_RAW_RX) {
        entry_rc = nvlink_throughput(gp, e->fieldId, e->scopeId, &u);
    } else {
        entry_rc = NVML_ERROR_NOT_SUPPORTED; /* nothing known about this id */
    }
    if (rc != UNSET) entry_rc = rc; /* field_rc.<id>: the entry's own return, whatever else is set */
    e->valueType = (nvmlValueType_t)(type != UNSET ? type : stored);
    e->nvmlReturn = entry_rc;
    if (entry_rc != NVML_SUCCESS) return; /* the value stays undefined (zero here) */
    if (stored == NVML_VALUE_TYPE_DOUBLE) e->value.dVal = d;
    else if (stored == NVML_VALUE_TYPE_UNSIGNED_INT) e->value.uiVal = (unsigned int)u;
    else e->value.ullVal = u;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    DEV_ENTER(nvmlDeviceGetFieldValues);
    if (!values || valuesCount <= 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    long long now = (long long)clock_us(CLOCK_REALTIME);
    for (int i = 0; i < valuesCount; i++) field_fill(gp, &values[i], now);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                                 nvmlViolationTime_t *violTime) {
    DEV_ENTER(nvmlDeviceGetViolationStatus);
    unsigned int p = (unsigned int)perfPolicyType;
    if (!violTime || p >= FAKE_VIOLATION_POLICIES) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!gp->violation_set[p]) return leave(NVML_ERROR_NOT_SUPPORTED);
    violTime->referenceTime = clock_us(CLOCK_REALTIME);
    violTime->violationTime = gp->violation_ns[p];
    return leave(NVML_SUCCESS);
}

/* ---- health: utilization sample buffers ----
 * Sample k (k >= 0) has timeStamp k * period µs on CLOCK_MONOTONIC and value pattern[k mod len];
 * the ring holds the latest `capacity` samples with timeStamp <= now. */

static unsigned int sample_value(const fake_gpu_t *gp, int type, unsigned long long k) {
    int n = gp->pattern_len[type];
    if (n > 0) return gp->pattern[type][k % (unsigned long long)n];
    switch (type) {
    case 1: return gp->util_gpu;
    case 2: return gp->util_mem;
    case 3: return gp->enc_util;
    default: return gp->dec_util;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                         unsigned long long lastSeenTimeStamp, nvmlValueType_t *sampleValType,
                                         unsigned int *sampleCount, nvmlSample_t *samples) {
    DEV_ENTER(nvmlDeviceGetSamples);
    if (mig_refuses(gp)) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!sampleValType || !sampleCount) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int t = (unsigned int)type;
    if (gp->samples_period_ms <= 0 || t < 1 || t >= FAKE_SAMPLE_TYPES) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (gp->samples_rc[t] != UNSET) return leave((nvmlReturn_t)gp->samples_rc[t]);
    unsigned long long period = (unsigned long long)gp->samples_period_ms * 1000ULL;
    unsigned long long cap = gp->samples_capacity > 0 ? (unsigned long long)gp->samples_capacity : 0;
    unsigned long long newest = clock_us(CLOCK_MONOTONIC) / period;      /* the last k with ts <= now */
    unsigned long long first = newest + 1 >= cap ? newest + 1 - cap : 0;  /* the oldest k still held */
    unsigned long long after = lastSeenTimeStamp / period + 1;           /* the first k with ts > lastSeen */
    if (after > first) first = after;
    unsigned long long avail = cap > 0 && first <= newest ? newest - first + 1 : 0;
    *sampleValType = (nvmlValueType_t)NVML_VALUE_TYPE_UNSIGNED_INT;
    if (avail == 0) {
        *sampleCount = 0;
        return leave(NVML_ERROR_NOT_FOUND);
    }
    if (!samples) {
        *sampleCount = (unsigned int)avail;
        return leave(NVML_SUCCESS);
    }
    if (*sampleCount == 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long n = *sampleCount < avail ? *sampleCount : avail;
    for (unsigned long long i = 0; i < n; i++) {
        unsigned long long k = first + i;
        memset(&samples[i], 0, sizeof(samples[i]));
        samples[i].timeStamp = k * period;
        samples[i].sampleValue.uiVal = sample_value(gp, (int)t, k);
    }
    *sampleCount = (unsigned int)n;
    return leave(NVML_SUCCESS);
}

/* ---- GPM (shared/reference/nvml-extended.md section 6) ----
 * A sample is a snapshot of a source's counters (source 0 the GPU, 1 + gi a GPU instance),
 * which grow at the configured rates: counter m gains milli[m] per microsecond. They are
 * advanced at every sample and at every scenario reload (with the rates in force until
 * then), so MetricsGet's delta / elapsed time is exactly the configured value while it is
 * constant, and a mix across a change. The counters outlive reloads, like hardware ones.
 * Live samples are counted; one still allocated at the last nvmlShutdown is reported, and
 * one used (taken, computed or freed) after that shutdown is a use after free: reported on
 * stderr and refused with INVALID_ARGUMENT (real NVML may crash). */
#define FAKE_GPM_MAGIC 0x47504d53u
#define FAKE_GPM_SOURCES (1 + FAKE_MAX_GI)
struct nvmlGpmSample_st {
    unsigned int magic;
    int generation;            /* g_gpm_generation at allocation */
    int gpu, source;           /* gpu -1 until taken */
    unsigned long long t_us;   /* CLOCK_MONOTONIC */
    unsigned __int128 acc[FAKE_GPM_IDS];
};
static unsigned __int128 g_gpm_acc[MAX_GPUS][FAKE_GPM_SOURCES][FAKE_GPM_IDS];
static unsigned long long g_gpm_last_us[MAX_GPUS][FAKE_GPM_SOURCES];

static const fake_gpm_t *gpm_source(const fake_gpu_t *gp, int source) {
    return source == 0 ? &gp->gpm_dev : &gp->gpm_gi[source - 1];
}

static void gpm_advance(int idx, int source, unsigned long long now) {
    const fake_gpm_t *src = gpm_source(&g.gpus[idx], source);
    unsigned long long last = g_gpm_last_us[idx][source];
    if (last != 0 && now > last)
        for (int m = 0; m < FAKE_GPM_IDS; m++)
            if (src->set[m] == 1) g_gpm_acc[idx][source][m] += (unsigned __int128)src->milli[m] * (now - last);
    g_gpm_last_us[idx][source] = now;
}

/* before a reload replaces the rates: what ran until now ran at the old ones */
static void gpm_advance_all(void) {
    unsigned long long now = clock_us(CLOCK_MONOTONIC);
    for (int i = 0; i < MAX_GPUS; i++)
        for (int src = 0; src < FAKE_GPM_SOURCES; src++)
            if (g_gpm_last_us[i][src]) gpm_advance(i, src, now);
}

/* 1 when the sample outlived the init it was allocated in (reported) */
__attribute__((unused)) static int gpm_stale(const struct nvmlGpmSample_st *smp, const char *fn) {
    if (smp->generation == g_gpm_generation) return 0;
    fprintf(stderr, "fake-nvml: GPM sample used after free: %s of a sample allocated before nvmlShutdown\n", fn);
    return 1;
}

__attribute__((unused)) static nvmlReturn_t gpm_take(int idx, int source, nvmlGpmSample_t smp) {
    unsigned long long now = clock_us(CLOCK_MONOTONIC);
    gpm_advance(idx, source, now);
    smp->gpu = idx;
    smp->source = source;
    smp->t_us = now;
    memcpy(smp->acc, g_gpm_acc[idx][source], sizeof smp->acc);
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    DEV_ENTER(nvmlGpmQueryDeviceSupport);
    if (!gpmSupport) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpmSupport->isSupportedDevice = (unsigned int)gp->gpm; /* pre-Hopper: SUCCESS with 0 */
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    SYS_ENTER(nvmlGpmSampleAlloc);
    if (!gpmSample) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct nvmlGpmSample_st *smp = calloc(1, sizeof *smp);
    if (!smp) return leave(NVML_ERROR_UNKNOWN);
    smp->magic = FAKE_GPM_MAGIC;
    smp->generation = g_gpm_generation;
    smp->gpu = -1;
    g_gpm_live++;
    *gpmSample = smp;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    SYS_ENTER(nvmlGpmSampleFree);
    if (!gpmSample || gpmSample->magic != FAKE_GPM_MAGIC) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (gpm_stale(gpmSample, "nvmlGpmSampleFree")) return leave(NVML_ERROR_INVALID_ARGUMENT);
    gpmSample->magic = 0;
    free(gpmSample);
    g_gpm_live--;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    DEV_ENTER(nvmlGpmSampleGet);
    if (!gpmSample || gpmSample->magic != FAKE_GPM_MAGIC || gpm_stale(gpmSample, "nvmlGpmSampleGet"))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!gp->gpm) return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(gpm_take(idx_, 0, gpmSample));
}

/* A GPU instance of the parent: one of its present MIG devices must belong to it. */
EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample) {
    DEV_ENTER(nvmlGpmMigSampleGet);
    if (!gpmSample || gpmSample->magic != FAKE_GPM_MAGIC || gpm_stale(gpmSample, "nvmlGpmMigSampleGet"))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!gp->gpm || !gp->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    int found = 0;
    for (int i = 0; gp->mig_detail && gp->mig_current && i < gp->n_mig; i++)
        if (gp->mig_slot_rc[i] == NVML_SUCCESS && gp->mig_gi[i] == gpuInstanceId) found = 1;
    if (!found) return leave(NVML_ERROR_NOT_FOUND);
    return leave(gpm_take(idx_, 1 + (int)gpuInstanceId, gpmSample));
}

static char g_gpm_short[] = "fake", g_gpm_long[] = "fake GPM metric", g_gpm_unit[] = "%";

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    SYS_ENTER(nvmlGpmMetricsGet);
    if (!metricsGet || metricsGet->version != NVML_GPM_METRICS_GET_VERSION) return leave(NVML_ERROR_INVALID_ARGUMENT);
    const struct nvmlGpmSample_st *s1 = metricsGet->sample1, *s2 = metricsGet->sample2;
    /* only numMetrics is relied on, never sizeof (headers differ in NVML_GPM_METRIC_MAX) */
    if (!s1 || !s2 || s1->magic != FAKE_GPM_MAGIC || s2->magic != FAKE_GPM_MAGIC || s1->gpu < 0 || s1->gpu != s2->gpu ||
        s1->source != s2->source || s2->t_us <= s1->t_us || metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (gpm_stale(s1, "nvmlGpmMetricsGet") | gpm_stale(s2, "nvmlGpmMetricsGet")) return leave(NVML_ERROR_INVALID_ARGUMENT);
    const fake_gpm_t *src = gpm_source(&g.gpus[s2->gpu], s2->source);
    unsigned long long dt = s2->t_us - s1->t_us;
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        unsigned int id = m->metricId;
        m->value = 0;
        m->metricInfo.shortName = g_gpm_short;
        m->metricInfo.longName = g_gpm_long;
        m->metricInfo.unit = g_gpm_unit;
        if (id >= FAKE_GPM_IDS || !src->set[id]) m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else {
            m->nvmlReturn = NVML_SUCCESS;
            if (src->set[id] == 2) m->value = __builtin_nan("");
            else if (src->set[id] == 3) m->value = (double)dt / 1e6;
            else m->value = (double)(unsigned long long)((s2->acc[id] - s1->acc[id]) / dt) / 1000.0;
        }
        if (id < FAKE_GPM_IDS && src->rc[id] != UNSET) m->nvmlReturn = src->rc[id];
    }
    return leave(NVML_SUCCESS);
}
#endif

/* ---- event sets (XID) ---- */
#include "fake_events.c"
