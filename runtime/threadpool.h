/* A pool of worker threads that runs one function on all of them at once, with a barrier for the
 * phases inside it: the shape a forward step needs (every worker walks the same list of nodes,
 * splitting each node's rows). Workers spin briefly between runs, then sleep on a futex, so a
 * decode step costs microseconds of dispatch and an idle server costs no CPU.
 *
 * Invariants: n_threads >= 1 and includes the calling thread; only one run is active at a time
 * (calls to kiri_threadpool_run from several threads are serialised by the caller). */
#ifndef KIRI_THREADPOOL_H
#define KIRI_THREADPOOL_H

struct kiri_threadpool;
struct kiri_threads;

int kiri_threadpool_init(int n_threads, struct kiri_threadpool **out);
void kiri_threadpool_free(struct kiri_threadpool *tp);

/* Runs fn(arg, ith, n) on every worker, ith = 0 on the caller, and returns when all are done. */
void kiri_threadpool_run(struct kiri_threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg);
/* Inside fn only: waits until all n workers have arrived. */
void kiri_threadpool_barrier(struct kiri_threadpool *tp);

/* The pool as the backend interface's struct kiri_threads (valid while the pool lives). */
void kiri_threadpool_as_threads(struct kiri_threadpool *tp, struct kiri_threads *out);

#endif
