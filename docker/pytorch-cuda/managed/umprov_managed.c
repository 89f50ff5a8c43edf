/* umprov's managed-memory segments for PyTorch (docs/managed-memory.md).
 *
 * umprov_managed.py makes each device's reservoir from these segments: a torch.cuda.MemPool
 * (use_on_oom) behind PyTorch's own caching allocator, which takes its free blocks where
 * device memory runs out. Each segment is CUDA managed (unified) memory preferred on the host
 * and mapped for the device that asked for it (accessed by): the GPU reads and writes it over
 * PCIe rather than migrating pages back and forth. Segments are bounded by the host: past its
 * budget (the memory available at the first segment, less a reserve) a segment is refused and
 * PyTorch raises out-of-memory as it would on the device, instead of the kernel's OOM killer
 * ending the process.
 *
 * No cache here: the caching allocator reuses blocks and gives segments back (empty_cache, or
 * before it reports out-of-memory), and a freed segment is freed at once.
 *
 * Headroom (umprov_headroom_install): PyTorch's caching allocator takes device memory until
 * cudaMalloc fails, which leaves CUDA nothing for what it allocates on its own later: a
 * kernel's module loaded at its first launch, a cuBLAS handle for a new thread, more local
 * memory. Those fail as "out of memory" inside a library, where nothing falls back to the
 * reservoir. The caching allocator's own cudaMalloc (its library's GOT slots, no other
 * library's) is pointed at guarded_malloc, which refuses a segment that would leave less than
 * the headroom free: PyTorch takes the reservoir instead, and CUDA keeps the rest.
 *
 * No CUDA header or library at build time: the CUDA runtime's functions come from the
 * libcudart that torch loaded (umprov_managed.py passes them to umprov_um_init), so there is
 * one runtime and one context, and the same build serves CUDA 12 and 13 (whose advice call
 * takes a cudaMemLocation by value instead of an int device).
 */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

typedef int (*malloc_managed_fn)(void **, size_t, unsigned int);
typedef int (*free_fn)(void *);
typedef struct { int type; int id; } um_location; /* cudaMemLocation */
typedef int (*advise13_fn)(const void *, size_t, int, um_location);
typedef int (*advise12_fn)(const void *, size_t, int, int);

enum { ATTACH_GLOBAL = 1, ADVISE_PREFERRED = 3, ADVISE_ACCESSED_BY = 5, LOC_DEVICE = 1,
       LOC_HOST = 2, CPU_DEVICE = -1 };

static struct {
  malloc_managed_fn malloc_managed;
  free_fn free_;
  void *advise;
  int v13, ready;
  long long host_budget; /* bytes segments may hold; < 0: set at the first segment */
  long long host_reserve;
  long long bytes, peak, allocs, failures, refused;
} um = {.host_budget = -1};
static pthread_mutex_t um_lock = PTHREAD_MUTEX_INITIALIZER;

/* Live segments, by address (a freed segment's size; whether an address is ours): open
 * addressing, cap a power of two, kept at most half full, ptr NULL is empty. */
typedef struct { void *ptr; long long size; } block;
static struct { block *at; size_t n, cap; } live;

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

static int advise(void *p, size_t n, int advice, int host, int device) {
  if (um.v13) {
    um_location loc = {host ? LOC_HOST : LOC_DEVICE, host ? 0 : device};
    return ((advise13_fn)um.advise)(p, n, advice, loc);
  }
  return ((advise12_fn)um.advise)(p, n, advice, host ? CPU_DEVICE : device);
}

/* MemAvailable from /proc/meminfo, in bytes; -1 where it cannot be read. */
static long long host_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

/* Called once from Python before the allocator is used. A host budget < 0 is taken from
 * the host at the first segment, less host_reserve. */
int umprov_um_init(void *malloc_managed, void *free_, void *advise_fn, int runtime_version,
                   long long host_budget, long long host_reserve) {
  if (!malloc_managed || !free_ || !advise_fn) return -1;
  um.malloc_managed = (malloc_managed_fn)malloc_managed;
  um.free_ = (free_fn)free_;
  um.advise = advise_fn;
  um.v13 = runtime_version >= 13000;
  um.host_budget = host_budget;
  um.host_reserve = host_reserve;
  um.ready = 1;
  return 0;
}

/* Whether a segment of size fits the host budget. Called with um_lock held. */
static int fits(long long size) {
  if (um.host_budget < 0) {
    long long avail = host_available();
    um.host_budget = avail > um.host_reserve ? avail - um.host_reserve : 0;
  }
  return um.bytes + size <= um.host_budget;
}

void *umprov_um_malloc(ssize_t size, int device, void *stream) {
  (void)stream;
  if (!um.ready || size <= 0) return NULL;
  pthread_mutex_lock(&um_lock);
  void *p = NULL;
  if (!fits(size) || um.malloc_managed(&p, (size_t)size, ATTACH_GLOBAL) != 0) {
    um.refused++; /* PyTorch frees its cached segments and asks again, or raises OOM */
    pthread_mutex_unlock(&um_lock);
    return NULL;
  }
  block x = {p, size};
  if (live_put(x) != 0) {
    um.free_(p);
    pthread_mutex_unlock(&um_lock);
    return NULL;
  }
  um.bytes += size;
  if (um.bytes > um.peak) um.peak = um.bytes;
  um.allocs++;
  pthread_mutex_unlock(&um_lock);
  int rc = advise(p, (size_t)size, ADVISE_PREFERRED, 1, device) |
           advise(p, (size_t)size, ADVISE_ACCESSED_BY, 0, device);
  if (rc) __atomic_add_fetch(&um.failures, 1, __ATOMIC_RELAXED); /* advice only: p stays good */
  return p;
}

/* PyTorch frees a segment only once no stream uses it (it synchronises first). */
void umprov_um_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device;
  (void)size;
  (void)stream;
  if (!ptr) return;
  pthread_mutex_lock(&um_lock);
  block x;
  int ours = live_take(ptr, &x) == 0;
  if (ours) um.bytes -= x.size;
  pthread_mutex_unlock(&um_lock);
  if (ours) um.free_(ptr);
}

/* 1 where the byte at p is in a live segment of ours (the reservoir, on the host), else 0
 * (a scan: segments are few, megabytes each). */
int umprov_um_owns(const void *p) {
  int ours = 0;
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&um_lock);
  for (size_t i = 0; i < live.cap && !ours; i++) {
    uintptr_t base = (uintptr_t)live.at[i].ptr;
    ours = base && a >= base && a < base + (uintptr_t)live.at[i].size;
  }
  pthread_mutex_unlock(&um_lock);
  return ours;
}

/* bytes in live segments, their peak, segments allocated, failed advice calls, segments
 * refused (past the host budget, or by CUDA), the host budget */
void umprov_um_stats(long long out[6]) {
  pthread_mutex_lock(&um_lock);
  long long s[6] = {um.bytes, um.peak, um.allocs, um.failures, um.refused, um.host_budget};
  memcpy(out, s, sizeof s);
  pthread_mutex_unlock(&um_lock);
}

/* Headroom: the caching allocator's cudaMalloc, refused short of the device's last bytes. */
typedef int (*cuda_malloc_fn)(void **, size_t);
typedef int (*mem_info_fn)(size_t *, size_t *);
typedef int (*last_error_fn)(void);
enum { CUDA_ERROR_MEMORY_ALLOCATION = 2 };

static struct {
  cuda_malloc_fn real;
  mem_info_fn info;
  last_error_fn clear; /* cudaGetLastError */
  size_t headroom;
  long long refused;
} guard;

static int guarded_malloc(void **p, size_t n) {
  size_t free_bytes = 0, total = 0, headroom = __atomic_load_n(&guard.headroom, __ATOMIC_RELAXED);
  if (guard.info(&free_bytes, &total) != 0) {
    guard.clear(); /* PyTorch checks the last error before its next allocation */
  } else if (free_bytes < headroom || free_bytes - headroom < n) {
    __atomic_add_fetch(&guard.refused, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_MEMORY_ALLOCATION; /* as cudaMalloc's own: PyTorch asks the reservoir */
  }
  return guard.real(p, n);
}

#if defined(__x86_64__)
#define SLOT(type) ((type) == R_X86_64_JUMP_SLOT || (type) == R_X86_64_GLOB_DAT)
#elif defined(__aarch64__)
#define SLOT(type) ((type) == R_AARCH64_JUMP_SLOT || (type) == R_AARCH64_GLOB_DAT)
#else
#define SLOT(type) 0 /* no headroom: umprov_headroom_install finds no slot */
#endif

typedef struct {
  const char *object; /* a part of the library's path */
  int slots, failed;
} target;

/* A dynamic entry's address: glibc relocates them in place, other loaders may not. */
static uintptr_t dyn_address(uintptr_t base, uintptr_t p) { return p < base ? base + p : p; }

/* Whether p is in the object's own segments (an unbound slot points at its PLT). */
static int inside(const struct dl_phdr_info *info, const void *p) {
  for (int h = 0; h < info->dlpi_phnum; h++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[h];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && (uintptr_t)p >= lo && (uintptr_t)p < lo + ph->p_memsz)
      return 1;
  }
  return 0;
}

static void point_slots(const struct dl_phdr_info *info, const ElfW(Rela) *rel, size_t bytes,
                        const ElfW(Sym) *syms, const char *names, target *t) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < bytes / sizeof *rel; i++) {
    if (!SLOT(ELF64_R_TYPE(rel[i].r_info)) ||
        strcmp(names + syms[ELF64_R_SYM(rel[i].r_info)].st_name, "cudaMalloc") != 0)
      continue;
    void **slot = (void **)(info->dlpi_addr + rel[i].r_offset);
    void *bound = __atomic_load_n(slot, __ATOMIC_SEQ_CST);
    if (bound != (void *)guarded_malloc && !inside(info, bound))
      guard.real = (cuda_malloc_fn)bound; /* bound already, maybe to an interposer: kept */
    /* RELRO leaves the slot read-only once bound: writable for the store, then read-only */
    void *start = (void *)((uintptr_t)slot & ~(page - 1));
    if (mprotect(start, page, PROT_READ | PROT_WRITE) != 0) {
      t->failed++;
      continue;
    }
    __atomic_store_n(slot, (void *)guarded_malloc, __ATOMIC_SEQ_CST);
    t->slots++;
    for (int h = 0; h < info->dlpi_phnum; h++) {
      /* the loader made read-only only the RELRO pages whole (both ends rounded down): a
       * page it shares with .data stays writable */
      const ElfW(Phdr) *ph = &info->dlpi_phdr[h];
      uintptr_t lo = (info->dlpi_addr + ph->p_vaddr) & ~(page - 1);
      uintptr_t hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(page - 1);
      if (ph->p_type == PT_GNU_RELRO && (uintptr_t)start >= lo && (uintptr_t)start < hi)
        mprotect(start, page, PROT_READ);
    }
  }
}

static int point_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  target *t = data;
  if (!info->dlpi_name || !strstr(info->dlpi_name, t->object)) return 0;
  const ElfW(Dyn) *dyn = NULL;
  for (int h = 0; h < info->dlpi_phnum; h++)
    if (info->dlpi_phdr[h].p_type == PT_DYNAMIC)
      dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[h].p_vaddr);
  if (!dyn) return 0;
  uintptr_t base = info->dlpi_addr, syms = 0, names = 0, jmprel = 0, rela = 0;
  size_t jmprel_bytes = 0, rela_bytes = 0;
  int rela_plt = 1;
  for (; dyn->d_tag != DT_NULL; dyn++) {
    switch (dyn->d_tag) {
      case DT_SYMTAB: syms = dyn_address(base, dyn->d_un.d_ptr); break;
      case DT_STRTAB: names = dyn_address(base, dyn->d_un.d_ptr); break;
      case DT_JMPREL: jmprel = dyn_address(base, dyn->d_un.d_ptr); break;
      case DT_PLTRELSZ: jmprel_bytes = dyn->d_un.d_val; break;
      case DT_PLTREL: rela_plt = dyn->d_un.d_val == DT_RELA; break;
      case DT_RELA: rela = dyn_address(base, dyn->d_un.d_ptr); break;
      case DT_RELASZ: rela_bytes = dyn->d_un.d_val; break;
      default: break;
    }
  }
  if (!syms || !names || !rela_plt) return 0;
  if (jmprel)
    point_slots(info, (const ElfW(Rela) *)jmprel, jmprel_bytes, (const ElfW(Sym) *)syms,
                (const char *)names, t);
  if (rela) /* GLOB_DAT: where the library takes cudaMalloc's address */
    point_slots(info, (const ElfW(Rela) *)rela, rela_bytes, (const ElfW(Sym) *)syms,
                (const char *)names, t);
  return 0;
}

/* Points every loaded library whose path holds ``object`` at guarded_malloc for cudaMalloc,
 * keeping ``headroom`` bytes of the device free; real_malloc, mem_get_info and get_last_error
 * are the CUDA runtime's cudaMalloc, cudaMemGetInfo and cudaGetLastError (a slot bound
 * already keeps what it was bound to). Returns the slots pointed (0: none found), or -1
 * where a slot could not be pointed. */
int umprov_headroom_install(const char *object, void *real_malloc, void *mem_get_info,
                            void *get_last_error, long long headroom) {
  if (!object || !real_malloc || !mem_get_info || !get_last_error || headroom < 0) return -1;
  if (!guard.real) guard.real = (cuda_malloc_fn)real_malloc;
  guard.info = (mem_info_fn)mem_get_info;
  guard.clear = (last_error_fn)get_last_error;
  __atomic_store_n(&guard.headroom, (size_t)headroom, __ATOMIC_SEQ_CST);
  target t = {object, 0, 0};
  dl_iterate_phdr(point_object, &t);
  return t.failed ? -1 : t.slots;
}

/* The headroom from now on (bytes; a negative one is ignored), without pointing anything. */
void umprov_headroom_set(long long headroom) {
  if (headroom >= 0) __atomic_store_n(&guard.headroom, (size_t)headroom, __ATOMIC_SEQ_CST);
}

/* cudaMalloc calls the headroom refused. */
long long umprov_headroom_refused(void) {
  return __atomic_load_n(&guard.refused, __ATOMIC_RELAXED);
}
