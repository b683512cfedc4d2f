/* A stand-in libnvidia-ml for the NVML backend's MIG tests (devices/nvml/fake_tests.rs): one
 * H100 80GB in MIG mode, its GPU instance profiles and placements as `nvidia-smi mig -lgip` /
 * `-lgipp` print them (docs/mig.md), GPU and compute instances made and destroyed through the
 * calls the backend makes, refused as the driver documents (INVALID_ARGUMENT for a placement
 * the profile may not take or a compute profile of another size, INSUFFICIENT_RESOURCES for an
 * overlap or a full profile, IN_USE for an instance with a process or a compute instance).
 * Only what the backend calls is here; types are laid out as nvml.h lays them out. */
#include <stdint.h>
#include <string.h>
#include <stdio.h>

typedef int nvmlReturn_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
       IN_USE = 19, INSUFFICIENT_RESOURCES = 23 };

typedef struct { unsigned start, size; } placement_t;
typedef struct { unsigned version, id, isP2pSupported, sliceCount, instanceCount,
                 multiprocessorCount, copyEngineCount, decoderCount, encoderCount, jpegCount,
                 ofaCount; unsigned long long memorySizeMB; char name[96]; } gi_profile_v2_t;
typedef struct { void *device; unsigned id, profileId; placement_t placement; } gi_info_t;
typedef struct { unsigned id, sliceCount, instanceCount, multiprocessorCount,
                 sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
                 sharedJpegCount, sharedOfaCount; } ci_profile_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2_t;
typedef struct { unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
                 sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
                 computeInstanceSliceCount; unsigned long long memorySizeMB; } attributes_t;

/* By profile index (NVML_GPU_INSTANCE_PROFILE_*): id, compute slices, instances, MiB, name,
 * memory slices, starts (-1 ends). */
struct profile { int index; unsigned id, slices, count; unsigned long long mib; const char *name;
                 unsigned size; int starts[8]; };
static const struct profile PROFILES[] = {
    {0, 19, 1, 7, 9984, "MIG 1g.10gb", 1, {0, 1, 2, 3, 4, 5, 6, -1}},
    {1, 14, 2, 3, 20096, "MIG 2g.20gb", 2, {0, 2, 4, -1}},
    {2, 9, 3, 2, 40448, "MIG 3g.40gb", 4, {0, 4, -1}},
    {3, 5, 4, 1, 40448, "MIG 4g.40gb", 4, {0, -1}},
    {4, 0, 7, 1, 81152, "MIG 7g.80gb", 8, {0, -1}},
    {7, 20, 1, 1, 9984, "MIG 1g.10gb+me", 1, {0, 1, 2, 3, 4, 5, 6, -1}},
    {9, 15, 1, 4, 20096, "MIG 1g.20gb", 2, {0, 2, 4, 6, -1}},
};
#define NPROFILES (sizeof PROFILES / sizeof PROFILES[0])

/* GPU instances by slot; a slot's compute instance is its MIG device. */
struct gi { int used; unsigned id; const struct profile *p; placement_t at; int ci; int busy; };
static struct gi GIS[8];
static char GPU; /* the one GPU's handle is &GPU */
static char CIS[8]; /* compute instance handles: &CIS[slot]; MIG device handles: &MIGS[slot] */
static char MIGS[8];

static const struct profile *by_id(unsigned id) {
    for (unsigned i = 0; i < NPROFILES; i++) if (PROFILES[i].id == id) return &PROFILES[i];
    return NULL;
}
static struct gi *gi_of(void *h) {
    struct gi *g = (struct gi *)h;
    return (g >= GIS && g < GIS + 8 && g->used) ? g : NULL;
}
static int slot_of(void *h, char *base) {
    char *c = (char *)h;
    return (c >= base && c < base + 8) ? (int)(c - base) : -1;
}

/* Test hooks: a process in GPU instance `id` (1) or none (0); how many GPU instances. */
int fake_nvml_set_busy(unsigned id, int busy) {
    for (int i = 0; i < 8; i++) if (GIS[i].used && GIS[i].id == id) { GIS[i].busy = busy; return 0; }
    return -1;
}
int fake_nvml_gpu_instances(void) {
    int n = 0;
    for (int i = 0; i < 8; i++) n += GIS[i].used;
    return n;
}

nvmlReturn_t nvmlInit_v2(void) { return OK; }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    if (i != 0) return INVALID_ARGUMENT;
    *h = &GPU;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *m) {
    if (h != &GPU) return NOT_SUPPORTED;
    *m = 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    if (h != &GPU) return NOT_SUPPORTED;
    *current = *pending = 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *out, unsigned len) {
    int s = slot_of(h, MIGS);
    if (h == &GPU) snprintf(out, len, "GPU-fake-0");
    else if (s >= 0 && GIS[s].used && GIS[s].ci) snprintf(out, len, "MIG-fake-0-gi%u", GIS[s].id);
    else return INVALID_ARGUMENT;
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(void *h, char *out, unsigned len) {
    int s = slot_of(h, MIGS);
    if (h == &GPU) snprintf(out, len, "NVIDIA H100 80GB HBM3");
    else if (s >= 0 && GIS[s].used) snprintf(out, len, "NVIDIA H100 80GB HBM3 %s", GIS[s].p->name);
    else return INVALID_ARGUMENT;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, memory_v2_t *m) {
    int s = slot_of(h, MIGS);
    unsigned long long mib = h == &GPU ? 81559 : (s >= 0 && GIS[s].used ? GIS[s].p->mib : 0);
    if (!mib) return INVALID_ARGUMENT;
    m->total = mib << 20;
    m->free = m->total;
    m->used = m->reserved = 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetAttributes_v2(void *h, attributes_t *a) {
    int s = slot_of(h, MIGS);
    memset(a, 0, sizeof *a);
    if (h == &GPU) { a->multiprocessorCount = 132; return OK; }
    if (s < 0 || !GIS[s].used) return INVALID_ARGUMENT;
    a->multiprocessorCount = GIS[s].p->slices * 16;
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = GIS[s].p->slices;
    a->memorySizeMB = GIS[s].p->mib;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) {
    if (h != &GPU) return INVALID_ARGUMENT;
    *n = 7;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned index, void **out) {
    unsigned k = 0;
    if (h != &GPU) return INVALID_ARGUMENT;
    for (int i = 0; i < 8; i++)
        if (GIS[i].used && GIS[i].ci && k++ == index) { *out = &MIGS[i]; return OK; }
    return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *h, unsigned *id) {
    int s = slot_of(h, MIGS);
    if (s < 0 || !GIS[s].used) return INVALID_ARGUMENT;
    *id = GIS[s].id;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *h, unsigned *id) {
    int s = slot_of(h, MIGS);
    if (s < 0 || !GIS[s].used || !GIS[s].ci) return INVALID_ARGUMENT;
    *id = 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *h, unsigned index, gi_profile_v2_t *info) {
    if (h != &GPU) return INVALID_ARGUMENT;
    if (info->version != (sizeof *info | 2u << 24)) return 25; /* ARGUMENT_VERSION_MISMATCH */
    for (unsigned i = 0; i < NPROFILES; i++) {
        const struct profile *p = &PROFILES[i];
        if (p->index != (int)index) continue;
        info->id = p->id;
        info->sliceCount = p->slices;
        info->instanceCount = p->count;
        info->memorySizeMB = p->mib;
        snprintf(info->name, sizeof info->name, "%s", p->name);
        return OK;
    }
    return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *h, unsigned id, placement_t *out,
                                                            unsigned *count) {
    const struct profile *p = by_id(id);
    unsigned n = 0;
    if (h != &GPU || !p) return INVALID_ARGUMENT;
    while (n < 8 && p->starts[n] >= 0) n++;
    if (!out) { *count = n; return OK; }
    if (*count < n) return 7; /* INSUFFICIENT_SIZE */
    for (unsigned i = 0; i < n; i++) { out[i].start = p->starts[i]; out[i].size = p->size; }
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *h, unsigned id, const placement_t *at,
                                                       void **out) {
    const struct profile *p = by_id(id);
    int ok = 0, free_slot = -1;
    unsigned of_profile = 0, gi_id = 1;
    if (h != &GPU || !p) return INVALID_ARGUMENT;
    for (int i = 0; i < 8 && p->starts[i] >= 0; i++) ok |= (unsigned)p->starts[i] == at->start;
    if (!ok || at->size != p->size) return INVALID_ARGUMENT;
    for (int i = 0; i < 8; i++) {
        if (!GIS[i].used) { if (free_slot < 0) free_slot = i; continue; }
        if (at->start < GIS[i].at.start + GIS[i].at.size && GIS[i].at.start < at->start + at->size)
            return INSUFFICIENT_RESOURCES;
        of_profile += GIS[i].p == p;
    }
    if (of_profile >= p->count || free_slot < 0) return INSUFFICIENT_RESOURCES;
    for (int taken = 1; taken;) {
        taken = 0;
        for (int i = 0; i < 8; i++) if (GIS[i].used && GIS[i].id == gi_id) { taken = 1; gi_id++; }
    }
    GIS[free_slot] = (struct gi){1, gi_id, p, *at, 0, 0};
    *out = &GIS[free_slot];
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstances(void *h, unsigned id, void **out, unsigned *count) {
    unsigned n = 0;
    if (h != &GPU || !by_id(id)) return INVALID_ARGUMENT;
    for (int i = 0; i < 8; i++) if (GIS[i].used && GIS[i].p->id == id) out[n++] = &GIS[i];
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *h, unsigned id, void **out) {
    if (h != &GPU) return INVALID_ARGUMENT;
    for (int i = 0; i < 8; i++) if (GIS[i].used && GIS[i].id == id) { *out = &GIS[i]; return OK; }
    return NOT_FOUND;
}
nvmlReturn_t nvmlGpuInstanceGetInfo(void *h, gi_info_t *info) {
    struct gi *g = gi_of(h);
    if (!g) return INVALID_ARGUMENT;
    info->device = &GPU;
    info->id = g->id;
    info->profileId = g->p->id;
    info->placement = g->at;
    return OK;
}
/* Compute profiles by index: 1, 2, 3, 4, 7 slices (ids = index), those the GPU instance holds. */
static const unsigned CI_SLICES[] = {1, 2, 3, 4, 7};
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(void *h, unsigned index, unsigned eng,
                                                           ci_profile_t *info) {
    struct gi *g = gi_of(h);
    if (!g || eng != 0) return INVALID_ARGUMENT;
    if (index >= 5 || CI_SLICES[index] > g->p->slices) return NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = index;
    info->sliceCount = CI_SLICES[index];
    info->instanceCount = g->p->slices / CI_SLICES[index];
    info->multiprocessorCount = CI_SLICES[index] * 16;
    return OK;
}
nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *h, unsigned id, void **out) {
    struct gi *g = gi_of(h);
    if (!g || id >= 5) return INVALID_ARGUMENT;
    /* The agent makes one compute instance of the whole GPU instance: another size is a test
     * failure here, not a driver behaviour. */
    if (CI_SLICES[id] != g->p->slices) return INVALID_ARGUMENT;
    if (g->ci) return INSUFFICIENT_RESOURCES;
    g->ci = 1;
    *out = &CIS[g - GIS];
    return OK;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *h, unsigned id, void **out) {
    struct gi *g = gi_of(h);
    if (!g) return INVALID_ARGUMENT;
    if (!g->ci || id != 0) return NOT_FOUND;
    *out = &CIS[g - GIS];
    return OK;
}
nvmlReturn_t nvmlComputeInstanceDestroy(void *h) {
    int s = slot_of(h, CIS);
    if (s < 0 || !GIS[s].used || !GIS[s].ci) return INVALID_ARGUMENT;
    if (GIS[s].busy) return IN_USE;
    GIS[s].ci = 0;
    return OK;
}
nvmlReturn_t nvmlGpuInstanceDestroy(void *h) {
    struct gi *g = gi_of(h);
    if (!g) return INVALID_ARGUMENT;
    if (g->ci || g->busy) return IN_USE;
    g->used = 0;
    return OK;
}
