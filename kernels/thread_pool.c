/* The process's compute threads for dsi's C kernels (see thread_pool.py).
 *
 * dsi_pool_run(part, ctx, parts) runs part(ctx, i, parts) for i in [0, parts): part 0 on the
 * calling thread, the others on workers 1 .. parts-1, started on first need and kept. Kernels
 * share their work out through it (columns of a product, rows of an attention), and are called
 * from Python through ctypes, which releases the interpreter lock: no Python runs on a worker.
 *
 * The job word is (sequence << 8) | parts: a worker reads which parts run from the same load
 * that tells it a job is there, so a worker with no part in a job never touches it, and a job's
 * context stays valid until every part of it has finished. Waits poll for SPINS pauses (about
 * the gap between two kernels of a step), then sleep on a futex. One job at a time: a second
 * caller meanwhile runs its parts itself, one after another. A forked child starts its own
 * workers (pthread_atfork).
 */
#define _GNU_SOURCE
#include "thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_THREADS 64
#define SPINS 20000

static struct {
    int started;
    pthread_mutex_t lock;
    _Atomic uint32_t word;
    _Atomic int32_t remaining;
    _Atomic uint32_t done_seq;
    pool_part_fn part;
    void *ctx;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void futex_wait(_Atomic uint32_t *addr, uint32_t seen) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, MAX_THREADS, NULL, NULL, 0);
}

static inline void pause_once(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The value at addr once it differs from seen. */
static uint32_t wait_change(_Atomic uint32_t *addr, uint32_t seen) {
    uint32_t now;
    for (int i = 0; i < SPINS; i++) {
        now = atomic_load_explicit(addr, memory_order_acquire);
        if (now != seen) return now;
        pause_once();
    }
    while ((now = atomic_load_explicit(addr, memory_order_acquire)) == seen) futex_wait(addr, seen);
    return now;
}

/* arg: (the job word when the worker was made) << 8 | its index */
static void *worker(void *arg) {
    int index = (int)((uintptr_t)arg & 0xff);
    uint32_t seen = (uint32_t)((uintptr_t)arg >> 8);
    for (;;) {
        seen = wait_change(&pool.word, seen);
        int parts = (int)(seen & 0xff);
        if (index >= parts) continue;
        pool.part(pool.ctx, index, parts);
        if (atomic_fetch_sub_explicit(&pool.remaining, 1, memory_order_acq_rel) == 1) {
            atomic_fetch_add_explicit(&pool.done_seq, 1, memory_order_release);
            futex_wake(&pool.done_seq);
        }
    }
    return NULL;
}

static void forget_workers(void) {
    pool.started = 0;
    pthread_mutex_init(&pool.lock, NULL);
    atomic_store(&pool.word, 0);
}

static void __attribute__((constructor)) on_load(void) { pthread_atfork(NULL, NULL, forget_workers); }

/* Starts workers up to threads - 1; returns how many threads a job may use. */
static int ensure_workers(int threads) {
    while (pool.started < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        uintptr_t arg = (uintptr_t)atomic_load(&pool.word) << 8 | (uintptr_t)(pool.started + 1);
        int failed = pthread_create(&t, &attr, worker, (void *)arg);
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool.started++;
    }
    return pool.started + 1;
}

/* How many workers this process has started (tests). */
int dsi_pool_workers(void) { return pool.started; }

void dsi_pool_run(pool_part_fn part, void *ctx, int parts) {
    if (parts > MAX_THREADS) parts = MAX_THREADS;
    int shared = parts >= 2 && pthread_mutex_trylock(&pool.lock) == 0;
    if (shared) {
        int threads = ensure_workers(parts);
        if (threads < parts) { /* no more threads to be had: the rest run here after part 0 */
            pthread_mutex_unlock(&pool.lock);
            shared = 0;
        }
    }
    if (!shared) {
        for (int i = 0; i < parts; i++) part(ctx, i, parts);
        return;
    }
    pool.part = part;
    pool.ctx = ctx;
    atomic_store_explicit(&pool.remaining, parts - 1, memory_order_relaxed);
    uint32_t done = atomic_load_explicit(&pool.done_seq, memory_order_relaxed);
    uint32_t word = atomic_load_explicit(&pool.word, memory_order_relaxed);
    atomic_store_explicit(&pool.word, (((word >> 8) + 1) << 8) | (uint32_t)parts, memory_order_release);
    futex_wake(&pool.word);
    part(ctx, 0, parts);
    wait_change(&pool.done_seq, done);
    pthread_mutex_unlock(&pool.lock);
}
