import type {ConnectorState} from './types.js'

/** A connector's state, logged once per change as `connector NAME: STATE (detail)`. */
export class ConnectorStatus {
  private current: ConnectorState = 'disconnected'
  private attempted = false

  constructor(
    private readonly name: string,
    private readonly log: (line: string) => void,
  ) {}

  get state(): ConnectorState {
    return this.current
  }

  set(state: ConnectorState, detail?: string): void {
    if (state === this.current && detail === undefined) return
    // a retry after a failure: its outcome (connected, or disconnected with the next delay) is the news
    const quiet = state === 'connecting' && this.current === 'disconnected' && this.attempted
    this.attempted = true
    this.current = state
    if (quiet) return
    this.log(`connector ${this.name}: ${state}${detail ? ` (${detail})` : ''}`)
  }

  /** A line about this connector that is not a state change (a failed reply, a skipped event). */
  note(line: string): void {
    this.log(`connector ${this.name}: ${line}`)
  }
}
