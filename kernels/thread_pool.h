/* The signature of thread_pool.c's dsi_pool_run, which kernels take as an argument: the pool is
 * one library, loaded once per process, whose address the Python wrappers pass in. */
#ifndef DSI_THREAD_POOL_H
#define DSI_THREAD_POOL_H

/* part(ctx, i, parts) for every i in [0, parts), part 0 on the calling thread. */
typedef void (*pool_part_fn)(void *ctx, int part, int parts);
typedef void (*pool_run_fn)(pool_part_fn part, void *ctx, int parts);

#endif
