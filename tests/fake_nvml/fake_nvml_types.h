/* Minimal NVML declarations for building the fake without NVIDIA's nvml.h.
 * Layouts follow shared/reference/nvml.md section 5; fake_nvml.c checks them with
 * _Static_assert, and the build against the official header (when the
 * nvidia-nvml-dev wheel installs) proves the prototypes. */
#ifndef FAKE_NVML_TYPES_H
#define FAKE_NVML_TYPES_H

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef int nvmlClockType_t;
typedef int nvmlTemperatureSensors_t;
typedef int nvmlPstates_t;
typedef int nvmlEnableState_t;
typedef int nvmlComputeMode_t;
typedef int nvmlMemoryErrorType_t;
typedef int nvmlEccCounterType_t;
typedef int nvmlDriverModel_t;
typedef int nvmlPcieUtilCounter_t;
typedef int nvmlBrandType_t;
typedef int nvmlValueType_t;
typedef int nvmlSamplingType_t;
typedef int nvmlPerfPolicyType_t;
typedef int nvmlPageRetirementCause_t;
typedef int nvmlNvLinkErrorCounter_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_TYPE_DOUBLE 0
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 (unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24U))

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    nvmlTemperatureSensors_t sensorType;
    int temperature;
} nvmlTemperature_v1_t;
typedef nvmlTemperature_v1_t nvmlTemperature_t;
#define nvmlTemperature_v1 (unsigned int)(sizeof(nvmlTemperature_v1_t) | (1 << 24U))

typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct nvmlBAR1Memory_st {
    unsigned long long bar1Total;
    unsigned long long bar1Free;
    unsigned long long bar1Used;
} nvmlBAR1Memory_t;

typedef struct nvmlConfComputeMemSizeInfo_st {
    unsigned long long protectedMemSizeKib;
    unsigned long long unprotectedMemSizeKib;
} nvmlConfComputeMemSizeInfo_t;

typedef struct nvmlProcessDetailList_st nvmlProcessDetailList_t; /* opaque here */

/* Field values, sample buffers, violation time (shared/reference/nvml-extended.md 3-5). */
typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct nvmlSample_st {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct nvmlViolationTime_st {
    unsigned long long referenceTime;
    unsigned long long violationTime;
} nvmlViolationTime_t;

/* GPM (shared/reference/nvml-extended.md section 6). */
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;
#define NVML_GPM_METRIC_MAX 477
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

/* GPU instances (MIG): what NVIDIA's DRA driver names a MIG device by */
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;
typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

#endif
