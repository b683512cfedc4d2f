/* A stand-in libnvidia-ml for the NVML backend's MIG tests (devices/nvml/fake_tests.rs): one
 * H100 80GB in MIG mode, its GPU instance profiles and placements as `nvidia-smi mig -lgip` /
 * `-lgipp` print them (docs/mig.md), GPU and compute instances made and destroyed through the
 * calls the backend makes, refused as the driver documents (INVALID_ARGUMENT for a placement
 * the profile may not take or a compute profile of another size, INSUFFICIENT_RESOURCES for an
 * overlap or a full profile, IN_USE for an instance with a process or a compute instance).
 * Processes are placed by the test (fake_nvml_process): listed on the MIG device of their GPU
 * instance and on the GPU with their GPU instance id, their bytes counted in the memory the
 * instance has in use. A second GPU, not in MIG mode, is there when the test asks before NVML
 * is loaded (fake_nvml_whole_gpu).
 * Only what the backend calls is here; types are laid out as nvml.h lays them out, and the test
 * compiles this file with the sizes and offsets of nvml-wrapper-sys's transcription of nvml.h
 * (the NVML_* macros below), so a layout of another size fails to build. */
#include <stdint.h>
#include <string.h>
#include <stdio.h>

typedef int nvmlReturn_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7,
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
/* nvmlProcessInfo_t (v2, the _v3 calls' element). */
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId,
                 computeInstanceId; } process_info_t;

#include <stddef.h>
#define SAME(type, size) _Static_assert(sizeof(type) == (size), #type " is not nvml.h's size")
SAME(gi_profile_v2_t, NVML_GI_PROFILE_V2_SIZE);
SAME(gi_info_t, NVML_GI_INFO_SIZE);
SAME(ci_profile_t, NVML_CI_PROFILE_SIZE);
SAME(memory_v2_t, NVML_MEMORY_V2_SIZE);
SAME(attributes_t, NVML_ATTRIBUTES_SIZE);
SAME(process_info_t, NVML_PROCESS_INFO_SIZE);
_Static_assert(offsetof(memory_v2_t, used) == NVML_MEMORY_V2_USED, "nvmlMemory_v2_t.used");
_Static_assert(offsetof(gi_info_t, placement) == NVML_GI_INFO_PLACEMENT, "placement");
_Static_assert(offsetof(process_info_t, gpuInstanceId) == NVML_PROCESS_INFO_GI, "gpuInstanceId");

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
struct gi { int used; unsigned id; const struct profile *p; placement_t at; int ci; };
static struct gi GIS[8];
static char GPU; /* the GPU in MIG mode's handle is &GPU */
static char WHOLE; /* the second GPU's, not in MIG mode, when there is one */
static int HAS_WHOLE;
/* Processes: on GPU instance `gi` of the GPU in MIG mode, or (gi 0) on the whole GPU. */
struct proc { int used; unsigned pid, gi; unsigned long long bytes; };
static struct proc PROCS[16];
/* 1: MIG device handles refuse process lists (NOT_SUPPORTED); 2: every handle does; 3: the
 * GPU in MIG mode does (as to an unprivileged caller, nvml.h), its MIG devices answer. */
static int REFUSE_LISTS;
#define NO_VALUE 0xFFFFFFFFu /* NVML_VALUE_NOT_AVAILABLE as a GPU/compute instance id */
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

static int busy(const struct gi *g) {
    for (int i = 0; i < 16; i++) if (PROCS[i].used && PROCS[i].gi == g->id) return 1;
    return 0;
}
static unsigned long long bytes_in(unsigned gi) {
    unsigned long long n = 0;
    for (int i = 0; i < 16; i++) if (PROCS[i].used && PROCS[i].gi == gi) n += PROCS[i].bytes;
    return n;
}

/* Test hooks. Process `pid` holding `bytes` on GPU instance `gi` (0: on the whole GPU), or
 * gone with 0 bytes; -1 where there is no such instance or no room. */
int fake_nvml_process(unsigned pid, unsigned gi, unsigned long long bytes) {
    int there = gi == 0 ? HAS_WHOLE : 0, free_slot = -1;
    for (int i = 0; i < 8; i++) there |= GIS[i].used && GIS[i].id == gi;
    for (int i = 0; i < 16; i++) {
        if (PROCS[i].used && PROCS[i].pid == pid) PROCS[i].used = 0;
        if (!PROCS[i].used && free_slot < 0) free_slot = i;
    }
    if (!bytes) return 0;
    if (!there || free_slot < 0) return -1;
    PROCS[free_slot] = (struct proc){1, pid, gi, bytes};
    return 0;
}
void fake_nvml_refuse_lists(int mode) { REFUSE_LISTS = mode; }
/* Before NVML is loaded: a second GPU, index and minor 1, not in MIG mode. */
void fake_nvml_whole_gpu(int on) { HAS_WHOLE = on; }
int fake_nvml_gpu_instances(void) {
    int n = 0;
    for (int i = 0; i < 8; i++) n += GIS[i].used;
    return n;
}

nvmlReturn_t nvmlInit_v2(void) { return OK; }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = 1 + HAS_WHOLE; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    if (i == 1 && HAS_WHOLE) { *h = &WHOLE; return OK; }
    if (i != 0) return INVALID_ARGUMENT;
    *h = &GPU;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *m) {
    if (h != &GPU && h != &WHOLE) return NOT_SUPPORTED;
    *m = h == &WHOLE;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    if (h != &GPU && h != &WHOLE) return NOT_SUPPORTED;
    *current = *pending = h == &GPU;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *out, unsigned len) {
    int s = slot_of(h, MIGS);
    if (h == &WHOLE) snprintf(out, len, "GPU-fake-1");
    else if (h == &GPU) snprintf(out, len, "GPU-fake-0");
    else if (s >= 0 && GIS[s].used && GIS[s].ci) snprintf(out, len, "MIG-fake-0-gi%u", GIS[s].id);
    else return INVALID_ARGUMENT;
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(void *h, char *out, unsigned len) {
    int s = slot_of(h, MIGS);
    if (h == &GPU || h == &WHOLE) snprintf(out, len, "NVIDIA H100 80GB HBM3");
    else if (s >= 0 && GIS[s].used) snprintf(out, len, "NVIDIA H100 80GB HBM3 %s", GIS[s].p->name);
    else return INVALID_ARGUMENT;
    return OK;
}
/* A MIG device's used memory is its processes'; a whole GPU's is theirs and the 512 MiB the
 * driver reserves (part of `used`, as NVML's R525 notes have it). The GPU in MIG mode answers
 * for all its instances, as to a privileged caller. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, memory_v2_t *m) {
    int s = slot_of(h, MIGS);
    unsigned long long mib = (h == &GPU || h == &WHOLE) ? 81559
                             : (s >= 0 && GIS[s].used ? GIS[s].p->mib : 0);
    if (!mib) return INVALID_ARGUMENT;
    if (m->version != (sizeof *m | 2u << 24)) return 25; /* ARGUMENT_VERSION_MISMATCH */
    m->total = mib << 20;
    m->reserved = h == &WHOLE ? 512ull << 20 : 0;
    if (h == &WHOLE) m->used = m->reserved + bytes_in(0);
    else if (h == &GPU) { m->used = 0; for (int i = 0; i < 8; i++) if (GIS[i].used) m->used += bytes_in(GIS[i].id); }
    else m->used = bytes_in(GIS[s].id);
    m->free = m->total - m->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetAttributes_v2(void *h, attributes_t *a) {
    int s = slot_of(h, MIGS);
    memset(a, 0, sizeof *a);
    if (h == &GPU || h == &WHOLE) { a->multiprocessorCount = 132; return OK; }
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

/* nvmlDeviceGetComputeRunningProcesses_v3: the GPU in MIG mode lists every instance's
 * processes with their GPU instance id; a MIG device its own instance's; the whole GPU its own,
 * with no instance id. Asked with too little room (or none), the count and INSUFFICIENT_SIZE. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count,
                                                     process_info_t *infos) {
    int s = slot_of(h, MIGS);
    unsigned n = 0;
    if (h != &GPU && h != &WHOLE && (s < 0 || !GIS[s].used || !GIS[s].ci)) return INVALID_ARGUMENT;
    if (REFUSE_LISTS == 2 || (REFUSE_LISTS == 1 && s >= 0) || (REFUSE_LISTS == 3 && h == &GPU))
        return NOT_SUPPORTED;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int i = 0; i < 16; i++) {
            const struct proc *p = &PROCS[i];
            int on = p->used && (h == &WHOLE ? p->gi == 0 : h == &GPU ? p->gi != 0 : p->gi == GIS[s].id);
            if (!on) continue;
            if (pass == 1) {
                infos[n] = (process_info_t){p->pid, p->bytes, h == &WHOLE ? NO_VALUE : p->gi,
                                            h == &WHOLE ? NO_VALUE : 0};
            }
            n++;
        }
        if (pass == 0 && (!infos || *count < n)) {
            *count = n;
            return n ? INSUFFICIENT_SIZE : OK;
        }
    }
    *count = n;
    return OK;
}
/* Graphics: none on a GPU; a MIG device (MIG runs no graphics) refuses the question. */
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *count,
                                                      process_info_t *infos) {
    (void)infos;
    if (slot_of(h, MIGS) >= 0) return NOT_SUPPORTED;
    if (h != &GPU && h != &WHOLE) return INVALID_ARGUMENT;
    if (REFUSE_LISTS == 2) return NOT_SUPPORTED;
    *count = 0;
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
    GIS[free_slot] = (struct gi){1, gi_id, p, *at, 0};
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
    if (busy(&GIS[s])) return IN_USE;
    GIS[s].ci = 0;
    return OK;
}
nvmlReturn_t nvmlGpuInstanceDestroy(void *h) {
    struct gi *g = gi_of(h);
    if (!g) return INVALID_ARGUMENT;
    if (g->ci || busy(g)) return IN_USE;
    g->used = 0;
    return OK;
}
