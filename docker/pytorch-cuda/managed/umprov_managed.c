/* umprov's managed-memory allocator for PyTorch (torch.cuda.memory.CUDAPluggableAllocator).
 *
 * Every tensor PyTorch allocates on the GPU is CUDA managed (unified) memory, so a working set
 * larger than the GPU's memory runs instead of failing with out-of-memory. Placement keeps a
 * working set that fits at device speed: while the bytes placed on the device stay within a
 * budget (the device memory free at the first allocation, less a reserve), an allocation is
 * preferred on the device and prefetched there on the allocating stream, so nothing faults.
 * Past the budget, an allocation is preferred on the host and mapped for the device (accessed
 * by): the GPU reads and writes it over PCIe rather than migrating pages back and forth.
 *
 * No CUDA header or library at build time: the CUDA runtime's functions come from the
 * libcudart that torch loaded (umprov_managed.py passes them to umprov_um_init), so there is
 * one runtime and one context, and the same build serves CUDA 12 and 13 (whose advice and
 * prefetch calls take a cudaMemLocation by value instead of an int device).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef int (*malloc_managed_fn)(void **, size_t, unsigned int);
typedef int (*free_fn)(void *);
typedef int (*mem_get_info_fn)(size_t *, size_t *);
typedef struct { int type; int id; } um_location; /* cudaMemLocation */
typedef int (*advise13_fn)(const void *, size_t, int, um_location);
typedef int (*advise12_fn)(const void *, size_t, int, int);
typedef int (*prefetch13_fn)(const void *, size_t, um_location, unsigned int, void *);
typedef int (*prefetch12_fn)(const void *, size_t, int, void *);

enum { ATTACH_GLOBAL = 1, ADVISE_PREFERRED = 3, ADVISE_ACCESSED_BY = 5, LOC_DEVICE = 1,
       LOC_HOST = 2, CPU_DEVICE = -1 };

static struct {
  malloc_managed_fn malloc_managed;
  free_fn free_;
  mem_get_info_fn mem_get_info;
  void *advise, *prefetch;
  int v13, ready;
  long long budget;  /* device bytes allocations may be placed in; < 0: set at the first one */
  long long reserve; /* device bytes kept free for others when the budget is set */
  long long placed, spilled, peak_placed, peak_spilled, allocs, failures;
} um = {.budget = -1};
static pthread_mutex_t um_lock = PTHREAD_MUTEX_INITIALIZER;

/* Which allocations were placed on the device: an open-addressed table of pointers. */
static uintptr_t *slots;
static size_t nslots, used;

static size_t slot_of(uintptr_t key) {
  size_t i = (size_t)((key >> 8) * 0x9E3779B97F4A7C15ull) & (nslots - 1);
  while (slots[i] && slots[i] != key) i = (i + 1) & (nslots - 1);
  return i;
}

static int remember(uintptr_t key) {
  if (2 * (used + 1) > nslots) {
    size_t old_n = nslots;
    uintptr_t *old = slots;
    nslots = old_n ? 2 * old_n : 4096;
    slots = calloc(nslots, sizeof *slots);
    if (!slots) { slots = old; nslots = old_n; return -1; }
    used = 0;
    for (size_t i = 0; i < old_n; i++)
      if (old[i] > 1) { slots[slot_of(old[i])] = old[i]; used++; }
    free(old);
  }
  slots[slot_of(key)] = key;
  used++;
  return 0;
}

static int forget(uintptr_t key) {
  if (!nslots) return 0;
  size_t i = slot_of(key);
  if (slots[i] != key) return 0;
  /* backward-shift deletion keeps every probe chain whole */
  size_t j = i;
  for (;;) {
    slots[i] = 0;
    for (;;) {
      j = (j + 1) & (nslots - 1);
      if (!slots[j]) { used--; return 1; }
      size_t home = (size_t)((slots[j] >> 8) * 0x9E3779B97F4A7C15ull) & (nslots - 1);
      if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) break;
    }
    slots[i] = slots[j];
    i = j;
  }
}

static int advise(void *p, size_t n, int advice, int host, int device) {
  if (um.v13) {
    um_location loc = {host ? LOC_HOST : LOC_DEVICE, host ? 0 : device};
    return ((advise13_fn)um.advise)(p, n, advice, loc);
  }
  return ((advise12_fn)um.advise)(p, n, advice, host ? CPU_DEVICE : device);
}

static int prefetch(void *p, size_t n, int device, void *stream) {
  if (um.v13) {
    um_location loc = {LOC_DEVICE, device};
    return ((prefetch13_fn)um.prefetch)(p, n, loc, 0, stream);
  }
  return ((prefetch12_fn)um.prefetch)(p, n, device, stream);
}

/* Called once from Python before the allocator is installed. */
int umprov_um_init(void *malloc_managed, void *free_, void *mem_get_info, void *advise_fn,
                   void *prefetch_fn, int runtime_version, long long budget, long long reserve) {
  if (!malloc_managed || !free_ || !mem_get_info || !advise_fn || !prefetch_fn) return -1;
  um.malloc_managed = (malloc_managed_fn)malloc_managed;
  um.free_ = (free_fn)free_;
  um.mem_get_info = (mem_get_info_fn)mem_get_info;
  um.advise = advise_fn;
  um.prefetch = prefetch_fn;
  um.v13 = runtime_version >= 13000;
  um.budget = budget;
  um.reserve = reserve;
  um.ready = 1;
  return 0;
}

void *umprov_um_malloc(ssize_t size, int device, void *stream) {
  void *p = NULL;
  if (!um.ready || size <= 0 || um.malloc_managed(&p, (size_t)size, ATTACH_GLOBAL) != 0)
    return NULL;
  pthread_mutex_lock(&um_lock);
  if (um.budget < 0) {
    size_t free_b = 0, total = 0;
    um.budget = um.mem_get_info(&free_b, &total) == 0 && (long long)free_b > um.reserve
                    ? (long long)free_b - um.reserve : 0;
  }
  int on_device = um.placed + size <= um.budget && remember((uintptr_t)p) == 0;
  if (on_device) {
    um.placed += size;
    if (um.placed > um.peak_placed) um.peak_placed = um.placed;
  } else {
    um.spilled += size;
    if (um.spilled > um.peak_spilled) um.peak_spilled = um.spilled;
  }
  um.allocs++;
  pthread_mutex_unlock(&um_lock);
  int rc;
  if (on_device)
    rc = advise(p, (size_t)size, ADVISE_PREFERRED, 0, device) |
         prefetch(p, (size_t)size, device, stream);
  else
    rc = advise(p, (size_t)size, ADVISE_PREFERRED, 1, device) |
         advise(p, (size_t)size, ADVISE_ACCESSED_BY, 0, device);
  if (rc) __atomic_add_fetch(&um.failures, 1, __ATOMIC_RELAXED); /* advice only: p stays good */
  return p;
}

void umprov_um_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device;
  (void)stream;
  if (!ptr) return;
  pthread_mutex_lock(&um_lock);
  if (forget((uintptr_t)ptr)) um.placed -= size;
  else um.spilled -= size;
  pthread_mutex_unlock(&um_lock);
  um.free_(ptr); /* cudaFree synchronises the device: nothing still uses ptr */
}

/* budget, placed, spilled, peak_placed, peak_spilled, allocs, failed advice calls */
void umprov_um_stats(long long out[7]) {
  pthread_mutex_lock(&um_lock);
  long long s[7] = {um.budget, um.placed, um.spilled, um.peak_placed, um.peak_spilled,
                    um.allocs, um.failures};
  memcpy(out, s, sizeof s);
  pthread_mutex_unlock(&um_lock);
}
