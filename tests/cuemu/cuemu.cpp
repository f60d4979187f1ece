// tests/cuemu/cuemu.cpp: the CUDA emulator's runtime (see include/cuda_runtime_api.h and README.md).
//
// Memory is the host's: cudaMalloc is an aligned allocation filled with 0xff bytes (NaN as floats, -1 as
// integers), so that a kernel that reads what nothing wrote shows it. Streams run their work at once, in the
// calling thread, one launch at a time (a global lock); a stream being captured records its work instead, and a
// graph replays the records. A launch runs its blocks one after another; a block's threads are fibers on their own
// stacks that switch only at the collectives: __syncthreads (a block barrier), and __syncwarp, the shuffles and
// mma.sync (warp barriers at which the lanes exchange their values). cp.async copies are made when the issuing
// thread waits for their group, never earlier, so a read that does not wait sees stale data.
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>
#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#define OSP_CUEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OSP_CUEMU_ASAN 1
#endif
#endif
#ifdef OSP_CUEMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator's fibers switch with x86-64 code"
#endif

// ---- fibers: a switch saves the callee-saved registers on the stack it leaves (the FP control words are the
// same in every fiber: no kernel changes them) ----
extern "C" void osp_cuemu_swap(void **save_sp, void *to_sp);
extern "C" void osp_cuemu_entry(void);
asm(R"(
    .text
    .globl osp_cuemu_swap
    .type osp_cuemu_swap, @function
osp_cuemu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size osp_cuemu_swap, .-osp_cuemu_swap
    .globl osp_cuemu_entry
    .type osp_cuemu_entry, @function
osp_cuemu_entry:
    movq %r12, %rdi
    call osp_cuemu_fiber_main@PLT
    ud2
    .size osp_cuemu_entry, .-osp_cuemu_entry
    .section .note.GNU-stack,"",@progbits
    .text
)");

namespace osp_cuemu {

static const size_t STACK = 256 * 1024; // a thread's stack (a guard page below it)
static const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024;

struct cp_op {
    void *dst;
    const void *src;
    int n;
    int64_t group; // -1: not committed yet
};

enum { AT_NONE, AT_BLOCK, AT_SYNCWARP, AT_SHFL, AT_MMA };
static const char *at_name(int k) {
    static const char *n[] = {"running", "__syncthreads", "__syncwarp", "a shuffle", "mma.sync"};
    return n[k];
}

struct thread_state {
    uint3 tid;
    int idx, lane, warp;
    void *sp;
    char *stack;
    bool done;
    int at; // the collective it waits at
    std::vector<cp_op> cp;
    int64_t groups;
    void *asan_fake;
};

struct mma_in {
    uint32_t a[4], b[2];
    float c[4];
};

struct warp_state {
    unsigned live; // lanes that exist and have not returned
    int arrived, need, kind; // need: the lanes of mask still live when the first arrived
    unsigned mask;
    uint64_t gen;
    uint64_t xch[2][32];
    unsigned given[2]; // the lanes that gave a value to a shuffle, by generation (a lane may return before the
                       // others read what it gave)
    mma_in mma[2][32];
    float d[2][16][8]; // an mma's results, by generation
    uint64_t d_gen;    // 1 + the generation whose results d holds
};

static thread_state *self;

static std::recursive_mutex lock;
static struct {
    std::vector<thread_state> th;
    std::vector<char *> stacks;
    std::vector<warp_state> warps;
    int live, bar_arrived;
    uint64_t bar_gen, idle;
    void *sched_sp;
    const void *sched_bottom;
    size_t sched_size;
    const std::function<void()> *body;
    unsigned char *smem;
    size_t smem_n;
    const void *fn;
} R;

[[noreturn]] static void fatal(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Dl_info di;
    const char *name = R.fn && dladdr(R.fn, &di) && di.dli_sname ? di.dli_sname : "?";
    if (self)
        fprintf(stderr, "cuemu: %s\ncuemu: in kernel %p (%s), block (%u,%u,%u) of (%u,%u,%u), thread (%u,%u,%u)\n", msg,
                R.fn, name, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, self->tid.x,
                self->tid.y, self->tid.z);
    else fprintf(stderr, "cuemu: %s\n", msg);
    fflush(stderr);
    abort();
}

int cur_lane; // the running thread's lane (lane() in cuda_runtime.h)
void *dyn_smem() { return R.smem; }

void check_align(const void *p, size_t a, const char *what) {
    if ((uintptr_t)p % a) fatal("%s from %p, which is not %zu-byte aligned", what, p, a);
}

// Switch from the running context (a thread, or the block's scheduler when self is null) to thread `to` (the
// scheduler when null). A thread that has finished never comes back (`finished`).
static void switch_to(thread_state *to, bool finished) {
    thread_state *from = self;
    void **save = from ? &from->sp : &R.sched_sp;
#ifdef OSP_CUEMU_ASAN
    void *sched_fake = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : from ? &from->asan_fake : &sched_fake,
                                   to ? (const void *)to->stack : R.sched_bottom, to ? STACK : R.sched_size);
#else
    (void)finished;
#endif
    self = to;
    if (to) threadIdx = to->tid, cur_lane = to->lane;
    osp_cuemu_swap(save, to ? to->sp : R.sched_sp);
    // resumed: the context that switched here set self to from
#ifdef OSP_CUEMU_ASAN
    __sanitizer_finish_switch_fiber(from ? from->asan_fake : sched_fake, nullptr, nullptr);
#endif
}

// the thread after t in the block that has not finished (t itself when it is the only one)
static thread_state *next_live(thread_state *t) {
    const int n = (int)R.th.size();
    for (int k = 1, i = t->idx; k <= n; k++) {
        thread_state *u = &R.th[(size_t)((i + k) % n)];
        if (!u->done) return u;
    }
    return nullptr;
}

[[noreturn]] static void deadlock() {
    int at[5] = {0};
    for (const thread_state &t : R.th)
        if (!t.done) at[t.at]++;
    fatal("the block's threads wait for each other forever (%d at __syncthreads, %d at __syncwarp, %d at a shuffle, "
          "%d at mma.sync)", at[AT_BLOCK], at[AT_SYNCWARP], at[AT_SHFL], at[AT_MMA]);
}

// the lane after t in its warp that has not finished (t itself when it is the only one)
static inline thread_state *next_in_warp(thread_state *t) {
    const int base = t->idx - t->lane, n = (int)R.th.size();
    if (t->lane < 31 && t->idx + 1 < n && !t[1].done) return t + 1; // the common case
    for (int k = 1; k < 32; k++) {
        const int i = base + (t->lane + k) % 32;
        if (i < n && !R.th[(size_t)i].done) return &R.th[(size_t)i];
    }
    return t;
}

// a thread waiting at a collective lets another run: at a warp collective, the next lane of its warp (only they
// can complete it; a warp runs on until it meets __syncthreads, and its lanes' stacks stay in the cache), at
// __syncthreads the next thread of the block. R.idle counts the switches since any thread last arrived, was
// released or finished: a round of them all without any means that none ever will.
static void yield() {
    thread_state *t = self;
    if (++R.idle > 2 * (uint64_t)R.live + 2) deadlock();
    thread_state *nx = t->at == AT_BLOCK ? next_live(t) : next_in_warp(t);
    if (nx != t) switch_to(nx, false);
}

static void release_block_if_all() {
    if (R.bar_arrived > 0 && R.bar_arrived >= R.live) R.bar_arrived = 0, R.bar_gen++, R.idle = 0;
}

static int popcount(unsigned v) { return __builtin_popcount(v); }

static void release_warp_if_all(warp_state &w) {
    if (w.arrived > 0 && w.arrived >= w.need) w.arrived = 0, w.gen++, R.idle = 0;
}

void sync_block() {
    thread_state *t = self;
    const uint64_t g = R.bar_gen;
    R.bar_arrived++, R.idle = 0;
    release_block_if_all();
    t->at = AT_BLOCK;
    while (R.bar_gen == g) yield();
    t->at = AT_NONE;
}

// a warp collective of kind k over the lanes of mask; returns the generation whose buffers hold its values
static uint64_t warp_meet(unsigned mask, int k) {
    thread_state *t = self;
    warp_state &w = R.warps[t->warp];
    if (!(mask >> t->lane & 1)) fatal("lane %d takes part in %s with a mask (%08x) that leaves it out", t->lane, at_name(k), mask);
    const uint64_t g = w.gen;
    if (w.arrived == 0) w.kind = k, w.mask = mask, w.need = (mask & w.live) == 0xffffffffu ? 32 : popcount(mask & w.live);
    else if (w.kind != k || w.mask != mask)
        fatal("the lanes of warp %d meet at different collectives: %s (mask %08x) and %s (mask %08x)", t->warp,
              at_name(w.kind), w.mask, at_name(k), mask);
    w.arrived++, R.idle = 0;
    release_warp_if_all(w);
    t->at = k;
    while (w.gen == g) yield();
    t->at = AT_NONE;
    return g;
}

void sync_warp(unsigned mask) { warp_meet(mask, AT_SYNCWARP); }

uint64_t shfl_bits(unsigned mask, uint64_t v, int src) {
    thread_state *t = self;
    warp_state &w = R.warps[t->warp];
    if (w.arrived == 0) w.given[w.gen & 1] = 0;
    w.xch[w.gen & 1][t->lane] = v;
    w.given[w.gen & 1] |= 1u << t->lane;
    const uint64_t g = warp_meet(mask, AT_SHFL);
    if (src < 0) return v;
    if (!(mask >> src & 1) || !(w.given[g & 1] >> src & 1)) return 0x7fc000007fc00000ull; // a lane that gave nothing: NaN
    return w.xch[g & 1][src];
}

static inline float bf(uint32_t word, int hi) { return __uint_as_float(hi ? word & 0xffff0000u : word << 16); }

// x rounded once to bf16 (nearest, ties to even; normal range): the double's significand rounded to 8 bits in its
// bits (the 45 below them dropped, half of them plus the kept last bit added first: a carry moves the exponent), then
// exact as a float
static uint32_t bf16_of(double x) {
    if (x == 0.0 || std::isnan(x) || std::isinf(x)) return __float_as_uint((float)x) >> 16;
    uint64_t u;
    memcpy(&u, &x, 8);
    u += ((uint64_t)1 << 44) - 1 + (u >> 45 & 1);
    u &= ~(((uint64_t)1 << 45) - 1);
    double r;
    memcpy(&r, &u, 8);
    return __float_as_uint((float)r) >> 16; // exact: 8 significant bits
}

// a bf16 times a bf16 is exact in double, and adding a third is exact unless their exponents lie over 40 apart
uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d = 0;
    for (int h = 0; h < 2; h++)
        d |= bf16_of((double)bf(a, h) * (double)bf(b, h) + (double)bf(c, h)) << (16 * h);
    return d;
}

void mma_m16n8k16_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    thread_state *t = self;
    warp_state &w = R.warps[t->warp];
    mma_in &in = w.mma[w.gen & 1][t->lane];
    in.a[0] = a0, in.a[1] = a1, in.a[2] = a2, in.a[3] = a3, in.b[0] = b0, in.b[1] = b1;
    for (int i = 0; i < 4; i++) in.c[i] = c[i];
    const uint64_t g = warp_meet(0xffffffffu, AT_MMA);
    const int grp = t->lane >> 2, tig = t->lane & 3;
    float(&d)[16][8] = w.d[g & 1];
    if (w.d_gen != g + 1) { // the first lane back computes the warp's tile
        w.d_gen = g + 1;
        // the fragments (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 * group + tig; A's registers 0-3 hold
        // (row group, cols 2tig..+1), (row group + 8, same cols), (row group, cols 2tig + 8..+9), (row group + 8,
        // those); B's 0-1 hold (rows 2tig..+1, col group), (rows 2tig + 8..+9, col group); C and D: (row group,
        // cols 2tig..+1), (row group + 8, cols 2tig..+1). The low half of a register holds the lower index.
        const mma_in *L = w.mma[g & 1];
        float A[16][16], B[8][16]; // B transposed: [col][k]
        double D[16][8];
        for (int ln = 0; ln < 32; ln++) {
            const int gr = ln >> 2, tg = ln & 3;
            for (int reg = 0; reg < 4; reg++)
                for (int h = 0; h < 2; h++) A[gr + 8 * (reg & 1)][2 * tg + 8 * (reg >> 1) + h] = bf(L[ln].a[reg], h);
            for (int reg = 0; reg < 2; reg++)
                for (int h = 0; h < 2; h++) B[gr][2 * tg + 8 * reg + h] = bf(L[ln].b[reg], h);
            for (int i = 0; i < 4; i++) D[gr + 8 * (i >> 1)][2 * tg + (i & 1)] = L[ln].c[i];
        }
        // the 16 products (exact in f32) and C summed in double, rounded once
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                double s = D[r][n];
                for (int k = 0; k < 16; k++) s += (double)(A[r][k] * B[n][k]);
                d[r][n] = (float)s;
            }
    }
    for (int i = 0; i < 4; i++) c[i] = d[grp + 8 * (i >> 1)][2 * tig + (i & 1)];
}

void cp_async(void *smem, const void *gmem, int bytes) {
    check_align(smem, (size_t)bytes, "cp.async (its shared-memory side)");
    check_align(gmem, (size_t)bytes, "cp.async (its global side)");
    self->cp.push_back(cp_op{smem, gmem, bytes, -1});
}

void cp_async_commit() {
    thread_state *t = self;
    t->groups++;
    for (cp_op &o : t->cp)
        if (o.group < 0) o.group = t->groups;
}

void cp_async_wait(int n) {
    thread_state *t = self;
    std::vector<cp_op> keep;
    for (const cp_op &o : t->cp)
        if (o.group >= 0 && o.group <= t->groups - n) memcpy(o.dst, o.src, (size_t)o.n);
        else keep.push_back(o);
    t->cp.swap(keep);
}

} // namespace osp_cuemu

using namespace osp_cuemu;

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

extern "C" void osp_cuemu_fiber_main(thread_state *t) {
#ifdef OSP_CUEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    (*R.body)();
    t->done = true;
    R.live--, R.idle = 0;
    warp_state &w = R.warps[t->warp];
    w.live &= ~(1u << t->lane);
    if (w.arrived > 0 && (w.mask >> t->lane & 1)) w.need--;
    release_warp_if_all(w);
    release_block_if_all();
    switch_to(R.live ? next_live(t) : nullptr, true);
    fatal("a finished thread was resumed");
}

namespace osp_cuemu {

static char *new_stack() {
    const long pg = sysconf(_SC_PAGESIZE);
    void *m = mmap(nullptr, STACK + (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fatal("no memory for a thread's stack");
    mprotect(m, (size_t)pg, PROT_NONE); // a guard page: an overflow faults
    return (char *)m + pg;
}

static void run_block(unsigned bx, unsigned by, unsigned bz) {
    blockIdx = uint3{bx, by, bz};
    const int n = (int)(blockDim.x * blockDim.y * blockDim.z), nw = (n + 31) / 32;
    R.th.resize((size_t)n);
    while ((int)R.stacks.size() < n) R.stacks.push_back(new_stack());
    // a warp's state: its control fields reset (its buffers are read only where a generation's fields say they
    // were written)
    if (R.warps.size() < (size_t)nw) R.warps.resize((size_t)nw);
    for (int i = 0; i < nw; i++) {
        warp_state &w = R.warps[(size_t)i];
        w.live = i < nw - 1 || n % 32 == 0 ? 0xffffffffu : (1u << (n % 32)) - 1;
        w.arrived = w.need = w.kind = 0, w.mask = 0, w.gen = 0, w.given[0] = w.given[1] = 0, w.d_gen = 0;
    }
    for (int i = 0; i < n; i++) {
        thread_state &t = R.th[(size_t)i];
        t.tid = uint3{(unsigned)i % blockDim.x, (unsigned)i / blockDim.x % blockDim.y,
                      (unsigned)i / (blockDim.x * blockDim.y)};
        t.idx = i, t.lane = i % 32, t.warp = i / 32, t.done = false, t.at = AT_NONE, t.groups = 0, t.asan_fake = nullptr;
        t.cp.clear();
        t.stack = R.stacks[(size_t)i];
        // the frame osp_cuemu_swap pops: r15..r12 (r12: the thread), rbx, rbp, then the return into
        // osp_cuemu_entry, which finds the stack 16-byte aligned; the stacks' tops are staggered over the cache's
        // sets (tops at one offset in their pages would all compete for the same lines)
        uint64_t *top = (uint64_t *)(t.stack + STACK - (size_t)(i * 1088 % 16384));
        uint64_t *sp = top - 9;
        sp[0] = sp[1] = sp[2] = 0;        // r15, r14, r13
        sp[3] = (uint64_t)(uintptr_t)&t; // r12
        sp[4] = sp[5] = 0;                // rbx, rbp
        sp[6] = (uint64_t)(uintptr_t)&osp_cuemu_entry;
        t.sp = sp;
    }
    if (R.smem_n) memset(R.smem, 0xff, R.smem_n);
    R.live = n, R.bar_arrived = 0, R.idle = 0;
#ifdef OSP_CUEMU_ASAN
    static thread_local void *lo;
    static thread_local size_t sz;
    if (!lo) { // the scheduler runs on the calling thread's own stack
        pthread_attr_t at;
        pthread_getattr_np(pthread_self(), &at);
        pthread_attr_getstack(&at, &lo, &sz);
        pthread_attr_destroy(&at);
    }
    R.sched_bottom = lo, R.sched_size = sz;
#endif
    switch_to(&R.th[0], false); // back when the last thread has finished
}

static int blocks_reversed() {
    static int r = -1;
    if (r < 0) {
        const char *e = getenv("OSP_CUEMU_BLOCKS");
        r = e && !strcmp(e, "reverse");
    }
    return r;
}

static void run_grid(const void *fn, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    gridDim = grid, blockDim = block, R.fn = fn, R.body = &body;
    std::vector<unsigned char> dyn(smem ? smem + 128 : 0);
    R.smem = smem ? (unsigned char *)(((uintptr_t)dyn.data() + 127) & ~(uintptr_t)127) : nullptr, R.smem_n = smem;
    const uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
    for (uint64_t k = 0; k < nb; k++) {
        const uint64_t b = blocks_reversed() ? nb - 1 - k : k;
        run_block((unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((uint64_t)grid.x * grid.y)));
    }
    R.fn = nullptr, R.body = nullptr, R.smem = nullptr, R.smem_n = 0;
}

} // namespace osp_cuemu

// ---- the runtime: streams, capture, graphs ----

namespace {
struct node {
    const void *fn; // a kernel, or null: a host-side operation (a copy, a memset, a GEMM)
    dim3 grid, block;
    size_t smem;
    std::function<void()> body;
};
} // namespace

struct CUstream_st {
    bool capturing, invalid;
    std::vector<node> nodes;
};
struct CUgraph_st {
    std::vector<node> nodes;
};
struct CUgraphExec_st {
    std::vector<node> nodes;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point t;
};

static cudaError_t last_error;
static int n_capturing;
static std::map<const char *, size_t> allocations; // base -> bytes (prefetch ranges are checked against them)
static std::unordered_map<const void *, int> smem_limit;

static cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

static void run_node(const node &n) {
    if (n.fn) run_grid(n.fn, n.grid, n.block, n.smem, n.body);
    else n.body();
}

// the work of an operation on stream st: run now, or recorded while st is captured; the legacy stream (null)
// synchronizes with every other, so it may not be used while one is captured
static cudaError_t submit(cudaStream_t st, node n) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (st && st->capturing) {
        if (!st->invalid) st->nodes.push_back(std::move(n));
        return cudaSuccess;
    }
    if (!st && n_capturing) return fail(cudaErrorStreamCaptureImplicit);
    run_node(n);
    return cudaSuccess;
}

static node host_op(std::function<void()> f) { return node{nullptr, dim3(), dim3(), 0, std::move(f)}; }

namespace osp_cuemu {
cudaError_t launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t st, std::function<void()> body) {
    std::lock_guard<std::recursive_mutex> g(lock);
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (!threads || threads > 1024 || block.z > 64 || !grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu ||
        grid.y > 65535 || grid.z > 65535)
        return fail(cudaErrorInvalidConfiguration);
    auto it = smem_limit.find(fn);
    if (smem > (it != smem_limit.end() ? (size_t)it->second : SMEM_DEFAULT)) return fail(cudaErrorInvalidValue);
    return submit(st, node{fn, grid, block, smem, std::move(body)});
}

// a bulk copy's global range: 16-byte aligned, a multiple of 16 bytes, and inside one allocation
void check_range(const void *p, uint64_t n, const char *what) {
    std::lock_guard<std::recursive_mutex> g(lock);
    check_align(p, 16, what);
    if (!n || n % 16) fatal("%s of %llu bytes (not a positive multiple of 16)", what, (unsigned long long)n);
    const char *c = (const char *)p;
    auto it = allocations.upper_bound(c);
    if (it == allocations.begin() || c + n > std::prev(it)->first + std::prev(it)->second)
        fatal("%s of %llu bytes from %p, outside every allocation", what, (unsigned long long)n, p);
}

// mbarriers and bulk copies (the tensor-core matmul's staged loads): a barrier expects one arrival with its
// transaction bytes; the copies that complete on it are made at the wait, never earlier, and their bytes must
// add up to what the arrival announced. The wait is block-wide here (each thread of the block waits on the
// barrier at the same point, as the kernels that use it do): once all have arrived, the first thread to run
// makes the copies.
struct mbar_state {
    uint32_t expect = 0, phase = 0;
    bool armed = false;
    std::vector<cp_op> copies;
};
static std::unordered_map<const void *, mbar_state> mbars;

void mbar_init(uint64_t *bar, unsigned count) {
    if (count != 1) fatal("an mbarrier of %u arrivals (the emulator models one)", count);
    mbars[bar] = mbar_state{};
}

void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    auto it = mbars.find(bar);
    if (it == mbars.end()) fatal("an arrival on an mbarrier that was never initialized");
    if (it->second.armed) fatal("a second arrival on an mbarrier of one");
    it->second.expect = bytes, it->second.armed = true;
}

void bulk_copy(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar) {
    check_align(smem, 16, "a bulk copy (its shared-memory side)");
    check_range(gmem, bytes, "a bulk copy");
    auto it = mbars.find(bar);
    if (it == mbars.end()) fatal("a bulk copy completing on an mbarrier that was never initialized");
    it->second.copies.push_back(cp_op{smem, gmem, (int)bytes, 0});
}

void mbar_wait(uint64_t *bar, uint32_t parity) {
    sync_block();
    auto it = mbars.find(bar);
    if (it == mbars.end()) fatal("a wait on an mbarrier that was never initialized");
    mbar_state &m = it->second;
    if (m.armed) { // the first thread past the block's arrival completes the phase
        uint64_t sum = 0;
        for (const cp_op &o : m.copies) sum += (uint64_t)o.n;
        if (sum != m.expect)
            fatal("an mbarrier expected %u bytes, and its bulk copies moved %llu", m.expect, (unsigned long long)sum);
        for (const cp_op &o : m.copies) memcpy(o.dst, o.src, (size_t)o.n);
        m.copies.clear();
        m.armed = false;
        m.phase ^= 1;
    }
    if ((m.phase ^ 1) != parity) fatal("a wait for phase parity %u of an mbarrier in phase %u", parity, m.phase);
}
} // namespace osp_cuemu

static int env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

extern "C" {

cudaError_t cudaMalloc(void **p, size_t n) {
    std::lock_guard<std::recursive_mutex> g(lock);
    void *m = nullptr;
    if (posix_memalign(&m, 256, n ? n : 1)) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n); // never written: NaN, or -1
    allocations[(const char *)m] = n ? n : 1;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!p) return cudaSuccess;
    if (!allocations.erase((const char *)p)) return fail(cudaErrorInvalidDevicePointer);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind, cudaStream_t st) {
    return submit(st, host_op([=]() { memmove(dst, src, n); }));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    return cudaMemcpyAsync(dst, src, n, k, nullptr);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
    return submit(st, host_op([=]() { memset(p, v, n); }));
}

cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, nullptr); }

cudaError_t cudaStreamCreate(cudaStream_t *st) {
    *st = new CUstream_st{false, false, {}};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (st && st->capturing) n_capturing--;
    delete st;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (st && st->capturing) {
        st->invalid = true;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (!st && n_capturing) return fail(cudaErrorStreamCaptureImplicit);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaStreamSynchronize(nullptr); }

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!st || st->capturing) return fail(cudaErrorIllegalState);
    st->capturing = true, st->invalid = false, st->nodes.clear();
    n_capturing++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *out) {
    std::lock_guard<std::recursive_mutex> g(lock);
    *out = nullptr;
    if (!st || !st->capturing) return fail(cudaErrorIllegalState);
    st->capturing = false, n_capturing--;
    if (st->invalid) {
        st->nodes.clear();
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *out = new CUgraph_st{std::move(st->nodes)};
    st->nodes.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    if (!g) return fail(cudaErrorInvalidValue);
    *e = new CUgraphExec_st{g->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!e) return fail(cudaErrorInvalidValue);
    if (st && st->capturing) return fail(cudaErrorStreamCaptureUnsupported);
    if (!st && n_capturing) return fail(cudaErrorStreamCaptureImplicit);
    for (const node &n : e->nodes) run_node(n);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new CUevent_st{};
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
    return submit(st, host_op([e]() { e->t = std::chrono::steady_clock::now(); }));
}

cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
    if (dev != 0) return fail(cudaErrorInvalidValue);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)SMEM_DEFAULT; break;
    case cudaDevAttrMultiProcessorCount: *v = env_int("OSP_CUEMU_SMS", 132); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)SMEM_OPTIN; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev) {
    if (dev != 0) return fail(cudaErrorInvalidValue);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "the CUDA emulator on the CPU");
    p->totalGlobalMem = (size_t)16 << 30;
    p->sharedMemPerBlock = SMEM_DEFAULT, p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->multiProcessorCount = env_int("OSP_CUEMU_SMS", 132);
    p->maxThreadsPerBlock = 1024, p->warpSize = 32, p->major = 9, p->minor = 0;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::recursive_mutex> g(lock);
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute a, int v) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || (size_t)v > SMEM_OPTIN)
        return fail(cudaErrorInvalidValue);
    smem_limit[fn] = v;
    return cudaSuccess;
}

// ---- cuBLAS: the one GEMM blas.c asks for (Aᵀ·B, bf16 in, f32 out, f32 compute) ----

struct cuemu_blas {
    cudaStream_t st;
};

int osp_cuemu_cublas_create(void **h) {
    *h = new cuemu_blas{nullptr};
    return 0;
}

int osp_cuemu_cublas_destroy(void *h) {
    delete (cuemu_blas *)h;
    return 0;
}

int osp_cuemu_cublas_set_stream(void *h, void *st) {
    ((cuemu_blas *)h)->st = (cudaStream_t)st;
    return 0;
}

int osp_cuemu_cublas_gemm_ex(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at,
                             int lda, const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc,
                             int compute, int algo) {
    (void)algo;
    enum { OP_N = 0, OP_T = 1, R_32F = 0, R_16BF = 14, COMPUTE_32F = 68, NOT_SUPPORTED = 15 };
    if (ta != OP_T || tb != OP_N || at != R_16BF || bt != R_16BF || ct != R_32F || compute != COMPUTE_32F)
        return NOT_SUPPORTED;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const uint16_t *a = (const uint16_t *)A, *b = (const uint16_t *)B;
    float *c = (float *)C;
    auto f = [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++)
                    s += (double)__uint_as_float((uint32_t)a[(int64_t)i * lda + l] << 16) *
                         (double)__uint_as_float((uint32_t)b[(int64_t)j * ldb + l] << 16);
                float *y = c + (int64_t)j * ldc + i;
                *y = al * (float)s + (be != 0.0f ? be * *y : 0.0f);
            }
    };
    return submit(((cuemu_blas *)h)->st, host_op(f)) == cudaSuccess ? 0 : 14 /* CUBLAS_STATUS_INTERNAL_ERROR */;
}

} // extern "C"
