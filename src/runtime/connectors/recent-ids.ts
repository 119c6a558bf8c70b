/** Remembers the last `capacity` ids, so a redelivered or double-sent event is handled once. */
export class RecentIds {
  private readonly ids = new Set<string>()

  constructor(private readonly capacity = 500) {}

  /** True the first time an id is seen. */
  firstSeen(id: string): boolean {
    if (this.ids.has(id)) return false
    this.ids.add(id)
    if (this.ids.size > this.capacity) {
      const oldest = this.ids.values().next().value as string
      this.ids.delete(oldest)
    }
    return true
  }
}
