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
 * Freed blocks are kept for the next allocation of the same size on the same stream (stream
 * order makes that reuse safe, as in PyTorch's own caching allocator): a training loop asks
 * for the same sizes every step, and cudaMallocManaged, the advice and cudaFree (which waits
 * for the whole device) would otherwise cost more than the step. Kept blocks are given back
 * when an allocation needs their room on the device, or with umprov_um_empty_cache.
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
  long long placed, spilled, peak_placed, peak_spilled, allocs, failures, reused;
} um = {.budget = -1};
static pthread_mutex_t um_lock = PTHREAD_MUTEX_INITIALIZER;

/* Live blocks, by address (to know a freed block's placement: a hash table, as a model holds
 * thousands of tensors), and kept ones (a growable array). */
typedef struct { void *ptr; long long size; void *stream; int on_device; } block;
typedef struct { block *at; size_t n, cap; } blocks;
static blocks live, kept; /* live: open addressing, cap a power of two, ptr NULL is empty */
static long long kept_bytes;

static size_t slot_of(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p; /* fmix64: allocations are aligned, the low bits alike */
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (size_t)h & (cap - 1);
}

static void put_at(block *at, size_t cap, block x) {
  size_t i = slot_of(x.ptr, cap);
  while (at[i].ptr) i = (i + 1) & (cap - 1);
  at[i] = x;
}

static int live_put(block x) { /* kept at most half full */
  if ((live.n + 1) * 2 > live.cap) {
    size_t cap = live.cap ? 2 * live.cap : 1024;
    block *at = calloc(cap, sizeof *at);
    if (!at) return -1;
    for (size_t i = 0; i < live.cap; i++)
      if (live.at[i].ptr) put_at(at, cap, live.at[i]);
    free(live.at);
    live.at = at;
    live.cap = cap;
  }
  put_at(live.at, live.cap, x);
  live.n++;
  return 0;
}

static int live_take(const void *p, block *out) { /* deletion shifts the probe chain back */
  if (!live.cap) return -1;
  size_t mask = live.cap - 1, i = slot_of(p, live.cap);
  while (live.at[i].ptr != p) {
    if (!live.at[i].ptr) return -1;
    i = (i + 1) & mask;
  }
  *out = live.at[i];
  for (size_t j = (i + 1) & mask; live.at[j].ptr; j = (j + 1) & mask) {
    size_t home = slot_of(live.at[j].ptr, live.cap);
    if (((j - home) & mask) >= ((j - i) & mask)) { /* home is not between i and j */
      live.at[i] = live.at[j];
      i = j;
    }
  }
  live.at[i].ptr = NULL;
  live.n--;
  return 0;
}

static int push(blocks *b, block x) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 1024;
    block *at = realloc(b->at, cap * sizeof *at);
    if (!at) return -1;
    b->at = at;
    b->cap = cap;
  }
  b->at[b->n++] = x;
  return 0;
}

static block take(blocks *b, size_t i) { /* order is not kept: the last fills the hole */
  block x = b->at[i];
  b->at[i] = b->at[--b->n];
  return x;
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

/* Give back every kept block (on the device only, or all); called with um_lock held. */
static void release_kept(int device_only) {
  for (size_t i = kept.n; i-- > 0;) {
    if (device_only && !kept.at[i].on_device) continue;
    block x = take(&kept, i);
    kept_bytes -= x.size;
    if (x.on_device) um.placed -= x.size;
    else um.spilled -= x.size;
    um.free_(x.ptr);
  }
}

void *umprov_um_malloc(ssize_t size, int device, void *stream) {
  if (!um.ready || size <= 0) return NULL;
  pthread_mutex_lock(&um_lock);
  for (size_t i = kept.n; i-- > 0;) {
    if (kept.at[i].size == size && kept.at[i].stream == stream) {
      block x = take(&kept, i);
      kept_bytes -= x.size;
      if (live_put(x) == 0) {
        um.reused++;
        pthread_mutex_unlock(&um_lock);
        return x.ptr;
      }
      um.free_(x.ptr); /* no room to track it: give it back */
      if (x.on_device) um.placed -= x.size;
      else um.spilled -= x.size;
      break;
    }
  }
  if (um.budget < 0) {
    size_t free_b = 0, total = 0;
    um.budget = um.mem_get_info(&free_b, &total) == 0 && (long long)free_b > um.reserve
                    ? (long long)free_b - um.reserve : 0;
  }
  if (um.placed + size > um.budget) release_kept(1); /* make room before spilling */
  void *p = NULL;
  if (um.malloc_managed(&p, (size_t)size, ATTACH_GLOBAL) != 0) {
    release_kept(0); /* out of memory: give back everything kept, then try once more */
    if (um.malloc_managed(&p, (size_t)size, ATTACH_GLOBAL) != 0) {
      pthread_mutex_unlock(&um_lock);
      return NULL;
    }
  }
  block x = {p, size, stream, um.placed + size <= um.budget};
  if (live_put(x) != 0) {
    um.free_(p);
    pthread_mutex_unlock(&um_lock);
    return NULL;
  }
  if (x.on_device) {
    um.placed += size;
    if (um.placed > um.peak_placed) um.peak_placed = um.placed;
  } else {
    um.spilled += size;
    if (um.spilled > um.peak_spilled) um.peak_spilled = um.spilled;
  }
  um.allocs++;
  pthread_mutex_unlock(&um_lock);
  int rc;
  if (x.on_device)
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
  (void)size;
  if (!ptr) return;
  pthread_mutex_lock(&um_lock);
  block x;
  if (live_take(ptr, &x) == 0) {
    x.stream = stream; /* the stream it was last used on: reuse stays in its order */
    if (push(&kept, x) == 0) kept_bytes += x.size;
    else {
      if (x.on_device) um.placed -= x.size;
      else um.spilled -= x.size;
      um.free_(ptr);
    }
  }
  pthread_mutex_unlock(&um_lock);
}

/* Give back every kept block (torch.cuda.empty_cache has no say over this allocator). */
void umprov_um_empty_cache(void) {
  pthread_mutex_lock(&um_lock);
  release_kept(0);
  pthread_mutex_unlock(&um_lock);
}

/* budget, placed, spilled, peak_placed, peak_spilled, allocs, failed advice calls, reused
 * blocks, bytes kept for reuse (placed and spilled include them) */
void umprov_um_stats(long long out[9]) {
  pthread_mutex_lock(&um_lock);
  long long s[9] = {um.budget, um.placed, um.spilled, um.peak_placed, um.peak_spilled,
                    um.allocs, um.failures, um.reused, kept_bytes};
  memcpy(out, s, sizeof s);
  pthread_mutex_unlock(&um_lock);
}
