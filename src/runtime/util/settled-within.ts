/**
 * `promise`, unless `ms` pass first (then `late()` is thrown) or `signal` aborts (then
 * `cancelled()`): a wait that ends at its deadline even when what it waits for never settles.
 * What it waits for goes on; its later outcome is ignored.
 */
export async function settledWithin<T>(
  promise: Promise<T>,
  ms: number,
  late: () => Error,
  options: {signal?: AbortSignal; cancelled?: () => Error} = {},
): Promise<T> {
  const {signal, cancelled = late} = options
  let timer: NodeJS.Timeout | undefined
  let onAbort = () => {}
  const cutOff = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(late()), ms)
    onAbort = () => reject(cancelled())
    if (signal?.aborted) onAbort()
    signal?.addEventListener('abort', onAbort, {once: true})
  })
  try {
    return await Promise.race([promise, cutOff])
  } finally {
    clearTimeout(timer)
    signal?.removeEventListener('abort', onAbort)
  }
}
