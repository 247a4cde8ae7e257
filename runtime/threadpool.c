#include "threadpool.h"

#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"

/* Spin iterations before a waiting worker sleeps; long enough to bridge the gap between the
 * nodes of one step and between decode steps, short enough that an idle pool sleeps. */
#define SPIN_LIMIT 20000

struct worker {
    struct kiri_threadpool *tp;
    struct kiri_thread *thread;
    int ith;
};

struct kiri_threadpool {
    int n;
    struct worker *workers;          /* owned, n - 1 entries (the caller is worker 0) */
    /* A run is published by bumping generation; workers run fn and count themselves done. */
    _Atomic uint32_t generation;
    _Atomic uint32_t n_done;
    _Atomic int caller_sleeping;     /* the caller sleeps on n_done */
    _Atomic int stop;
    void (*fn)(void *, int, int);
    void *arg;
    /* Sense-reversing barrier. */
    _Atomic int barrier_count;
    _Atomic uint32_t barrier_sense;
    _Atomic int barrier_sleepers;    /* workers asleep on barrier_sense */
};

/* Busy-waiting is cheapest while every worker has its own core. When the machine is busy with
 * other work the thread being waited for may not be running, and spinning (or yielding) would
 * keep it off the core: after a short spin a waiter sleeps on a futex, announcing itself in
 * *sleepers so the thread that releases it knows to make the wake-up call (with sequentially
 * consistent operations, either the releaser sees the sleeper or the sleeper sees the new value). */
#define SPIN_BEFORE_SLEEP 4000

static void wait_while_equal(_Atomic uint32_t *addr, uint32_t old, _Atomic int *sleepers)
{
    for (int spins = 0; spins < SPIN_BEFORE_SLEEP; spins++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != old)
            return;
        kiri_platform_cpu_relax();
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(addr) == old)
        kiri_platform_wait((const volatile uint32_t *)addr, old);
    atomic_fetch_sub(sleepers, 1);
}

static void wake_sleepers(_Atomic uint32_t *addr, _Atomic int *sleepers)
{
    if (atomic_load(sleepers) > 0)
        kiri_platform_wake_all((const volatile uint32_t *)addr);
}

static void worker_main(void *p)
{
    struct worker *w = p;
    struct kiri_threadpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&tp->stop, memory_order_acquire))
                return;
            if (++spins < SPIN_LIMIT)
                kiri_platform_cpu_relax();
            else
                kiri_platform_wait((const volatile uint32_t *)&tp->generation, seen);
        }
        seen = gen;
        if (atomic_load_explicit(&tp->stop, memory_order_acquire))
            return;
        tp->fn(tp->arg, w->ith, tp->n);
        atomic_fetch_add(&tp->n_done, 1);
        wake_sleepers(&tp->n_done, &tp->caller_sleeping);
    }
}

int kiri_threadpool_init(int n_threads, struct kiri_threadpool **out)
{
    if (n_threads < 1)
        n_threads = 1;
    struct kiri_threadpool *tp = kiri_mem_calloc(1, sizeof *tp);
    if (!tp)
        return KIRI_E_NOMEM;
    tp->n = n_threads;
    if (n_threads > 1) {
        tp->workers = kiri_mem_calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            kiri_mem_free(tp);
            return KIRI_E_NOMEM;
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        tp->workers[i].tp = tp;
        tp->workers[i].ith = i + 1;
        if (kiri_platform_thread_start(&tp->workers[i].thread, worker_main, &tp->workers[i]) != 0) {
            tp->n = i + 1; /* shut down the ones started */
            kiri_threadpool_free(tp);
            return KIRI_E_NOMEM;
        }
    }
    *out = tp;
    return KIRI_OK;
}

void kiri_threadpool_free(struct kiri_threadpool *tp)
{
    if (!tp)
        return;
    atomic_store_explicit(&tp->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_acq_rel);
    kiri_platform_wake_all((const volatile uint32_t *)&tp->generation);
    for (int i = 0; i < tp->n - 1; i++)
        kiri_platform_thread_join(tp->workers[i].thread);
    kiri_mem_free(tp->workers);
    kiri_mem_free(tp);
}

void kiri_threadpool_run(struct kiri_threadpool *tp, void (*fn)(void *, int, int), void *arg)
{
    if (tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_acq_rel);
    kiri_platform_wake_all((const volatile uint32_t *)&tp->generation);
    fn(arg, 0, tp->n);
    uint32_t done;
    while ((done = atomic_load(&tp->n_done)) < (uint32_t)tp->n - 1)
        wait_while_equal(&tp->n_done, done, &tp->caller_sleeping);
}

void kiri_threadpool_barrier(struct kiri_threadpool *tp)
{
    if (tp->n == 1)
        return;
    const uint32_t sense = atomic_load(&tp->barrier_sense);
    if (atomic_fetch_add(&tp->barrier_count, 1) == tp->n - 1) {
        atomic_store(&tp->barrier_count, 0);
        atomic_store(&tp->barrier_sense, sense + 1);
        wake_sleepers(&tp->barrier_sense, &tp->barrier_sleepers);
    } else {
        wait_while_equal(&tp->barrier_sense, sense, &tp->barrier_sleepers);
    }
}

static void threads_run(void *pool, void (*fn)(void *, int, int), void *arg)
{
    kiri_threadpool_run(pool, fn, arg);
}

static void threads_barrier(void *pool) { kiri_threadpool_barrier(pool); }

void kiri_threadpool_as_threads(struct kiri_threadpool *tp, struct kiri_threads *out)
{
    out->n = tp->n;
    out->run = threads_run;
    out->barrier = threads_barrier;
    out->pool = tp;
}
