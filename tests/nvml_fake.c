/* A stand-in libnvidia-ml.so.1 for tests/test_gpus.py, on machines without an NVIDIA driver: the
   NVML functions the probe calls, with nvml.h's signatures and structures, answering fixed values
   for two GPUs (a third is lost), and their events: GPU 0 (a GeForce) takes Xid events but no ECC
   ones, GPU 1 all three; after registration the waits deliver an Xid 13 on GPU 0, an Xid 79 and a
   double-bit ECC event on GPU 1, then time out. It checks the ctypes layer's side of the ABI (structure layouts and versions, the
   process list's size protocol, the fallbacks to older names), not NVML itself.

   cc -shared -fPIC -o libnvidia-ml.so.1 nvml_fake.c            the current API
   cc -shared -fPIC -DOLD_DRIVER -o libnvidia-ml.so.1 nvml_fake.c   only the old names (v1 calls)
*/

#include <string.h>

typedef int nvmlReturn_t;
typedef struct { int index; } *nvmlDevice_t;

#define SUCCESS 0
#define ERROR_UNINITIALIZED 1
#define ERROR_INVALID_ARGUMENT 2
#define ERROR_NOT_SUPPORTED 3
#define ERROR_INSUFFICIENT_SIZE 7
#define ERROR_TIMEOUT 10
#define ERROR_GPU_IS_LOST 15
#define VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

static struct { int index; } devices[3] = {{0}, {1}, {2}};
static int started = 0;
static const unsigned long long MIB = 1024ULL * 1024ULL;

static int bad(nvmlDevice_t device) { return !started || device == 0 || device->index < 0 || device->index > 2; }

nvmlReturn_t nvmlInit_v2(void) { started = 1; return SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { started = 0; return SUCCESS; }

#define EVENT_SINGLE_BIT_ECC 0x1ULL
#define EVENT_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_XID 0x8ULL
struct event_set { int created; unsigned long long registered[3]; int next; };
typedef struct event_set *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
#ifndef OLD_DRIVER
    unsigned int gpuInstanceId, computeInstanceId;  /* the _v2 wait's; the old one has only three */
#endif
} nvmlEventData_t;
static struct event_set event_set;
static const struct { int device; unsigned long long type, data; } events[] = {
    {0, EVENT_XID, 13}, {1, EVENT_XID, 79}, {0, EVENT_SINGLE_BIT_ECC, 0}, {1, EVENT_DOUBLE_BIT_ECC, 0},
};
static const unsigned long long supported[3] = {EVENT_XID, EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC, 0};

const char *nvmlErrorString(nvmlReturn_t code) {
    switch (code) {
    case ERROR_NOT_SUPPORTED: return "Not Supported";
    case ERROR_GPU_IS_LOST: return "GPU is lost";
    case ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!started) return ERROR_UNINITIALIZED;
    strncpy(version, "550.54.15", length);
    return SUCCESS;
}

#ifdef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
#else
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
#endif
    if (!started) return ERROR_UNINITIALIZED;
    *count = 3;
    return SUCCESS;
}

#ifdef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
#else
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
#endif
    if (!started) return ERROR_UNINITIALIZED;
    if (index == 2) return ERROR_GPU_IS_LOST;
    if (index > 2) return ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)&devices[index];
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    strncpy(name, device->index ? "NVIDIA H100 80GB HBM3" : "NVIDIA GeForce RTX 4090", length);
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    strncpy(uuid, device->index ? "GPU-11111111-2222-3333-4444-555555555555" : "GPU-aaaaaaaa-bbbb", length);
    return SUCCESS;
}

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
#else
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
#endif
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    strcpy(pci->busId, device->index ? "00000000:18:00.0" : "00000000:01:00.0");
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    util->gpu = device->index ? 97 : 3;
    util->memory = device->index ? 41 : 1;
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    memory->total = (device->index ? 81559ULL : 24564ULL) * MIB;
    memory->used = (device->index ? 70001ULL : 801ULL) * MIB;  /* v1: with the driver's reserve */
    memory->free = memory->total - memory->used;
    return SUCCESS;
}

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    if (memory->version != (sizeof(nvmlMemory_v2_t) | (2u << 24))) return ERROR_INVALID_ARGUMENT;
    memory->total = (device->index ? 81559ULL : 24564ULL) * MIB;
    memory->reserved = 500ULL * MIB;
    memory->used = (device->index ? 69501ULL : 301ULL) * MIB;
    memory->free = memory->total - memory->used - memory->reserved;
    return SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    if (bad(device) || sensor != 0) return ERROR_INVALID_ARGUMENT;
    *temp = device->index ? 71 : 38;
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    *power = device->index ? 612340 : 21500;
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    *limit = device->index ? 700000 : 450000;
    return SUCCESS;
}

#ifdef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
#else
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
#endif
    if (bad(device)) return ERROR_INVALID_ARGUMENT;
    *reasons = device->index ? (0x4ULL | 0x20ULL) : 0x1ULL;
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *count) {
    if (bad(device) || counterType != 0) return ERROR_INVALID_ARGUMENT;
    if (device->index == 0) return ERROR_NOT_SUPPORTED;  /* a GeForce: no ECC */
    *count = errorType ? 1 : 5;
    return SUCCESS;
}

/* The size protocol: too small an array is INSUFFICIENT_SIZE with the count needed. */
#define PROCESSES(NAME, TYPE, N, FILL)                                                   \
    nvmlReturn_t NAME(nvmlDevice_t device, unsigned int *count, TYPE *infos) {            \
        if (bad(device)) return ERROR_INVALID_ARGUMENT;                                   \
        unsigned int needed = device->index ? (N) : 0;                                    \
        if (*count < needed || (needed && infos == 0)) { *count = needed; return needed ? ERROR_INSUFFICIENT_SIZE : SUCCESS; } \
        *count = needed;                                                                  \
        for (unsigned int i = 0; i < needed; i++) { memset(&infos[i], 0, sizeof(TYPE)); FILL; } \
        return SUCCESS;                                                                   \
    }

#define COMPUTE_FILL infos[i].pid = 4100 + i; infos[i].usedGpuMemory = i ? VALUE_NOT_AVAILABLE : 69000ULL * MIB
#define GRAPHICS_FILL infos[i].pid = 4100; infos[i].usedGpuMemory = 69000ULL * MIB

#ifdef OLD_DRIVER
PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 2, COMPUTE_FILL)
PROCESSES(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 1, GRAPHICS_FILL)
#else
PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, 2, COMPUTE_FILL)
PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_v2_t, 1, GRAPHICS_FILL)
#endif

/* Events: one set, registered per device; NOT_SUPPORTED for a mask with a type the device lacks. */
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!started || set == 0) return ERROR_UNINITIALIZED;
    memset(&event_set, 0, sizeof(event_set));
    event_set.created = 1;
    *set = &event_set;
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    if (bad(device) || set != &event_set || !set->created) return ERROR_INVALID_ARGUMENT;
    if (types & ~supported[device->index]) return ERROR_NOT_SUPPORTED;
    set->registered[device->index] |= types;
    return SUCCESS;
}

/* The probe must never block: any timeout but 0 ms is refused. */
#ifdef OLD_DRIVER
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
#else
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
#endif
    if (!started || set != &event_set || !set->created || timeoutms != 0) return ERROR_INVALID_ARGUMENT;
    while (set->next < (int)(sizeof(events) / sizeof(events[0]))) {
        int i = set->next++;
        if (!(set->registered[events[i].device] & events[i].type)) continue;  /* not registered: not delivered */
        memset(data, 0, sizeof(*data));
        data->device = (nvmlDevice_t)&devices[events[i].device];
        data->eventType = events[i].type;
        data->eventData = events[i].data;
#ifndef OLD_DRIVER
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
#endif
        return SUCCESS;
    }
    return ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (set != &event_set || !set->created) return ERROR_INVALID_ARGUMENT;
    set->created = 0;
    return SUCCESS;
}
