import {afterEach, describe, expect, it, vi} from 'vitest'
import {ConnectorStatus} from '../../../src/runtime/connectors/connector-status.js'

/*
 * Issue 28: while a platform is down the log stays readable (a line per cause, then one a minute),
 * and what /healthz reads says when the next attempt is due.
 */

afterEach(() => vi.useRealTimers())

describe('ConnectorStatus', () => {
  it('an hour of failed attempts every 2 s: one line for the cause, then one a minute; the state and next attempt stay exact', () => {
    vi.useFakeTimers({now: new Date('2026-12-04T10:00:00Z')})
    const lines: string[] = []
    const status = new ConnectorStatus('a1/meepachat', (line) => lines.push(line))
    status.connecting('ws://chat/api/bot-gateway')
    status.connected('as meepabot')
    for (let attempt = 0; attempt < 1800; attempt++) {
      status.down('connect ECONNREFUSED 127.0.0.1:8091', 2000)
      vi.advanceTimersByTime(2000)
      status.connecting() // the next attempt: its outcome is the news
    }
    expect(lines[0]).toBe('connector a1/meepachat: connecting (ws://chat/api/bot-gateway)')
    expect(lines[1]).toBe('connector a1/meepachat: connected (as meepabot)')
    expect(lines[2]).toBe(
      'connector a1/meepachat: reconnecting (connect ECONNREFUSED 127.0.0.1:8091; next attempt in 2 s)',
    )
    expect(lines.length).toBeLessThanOrEqual(3 + 60)
    expect(lines.at(-1)).toMatch(
      /^connector a1\/meepachat: still reconnecting \(\d+ attempts since 2026-12-04T10:00:00\.000Z: connect ECONNREFUSED/,
    )
    expect(status.state).toBe('reconnecting')
    expect(status.problem()).toBe(
      'reconnecting: connect ECONNREFUSED 127.0.0.1:8091; next attempt at 2026-12-04T11:00:00.000Z',
    )
    expect(status.nextAttempt?.toISOString()).toBe('2026-12-04T11:00:00.000Z')

    status.down('the server refused the bot token (HTTP 401); check bot_token', 30_000)
    expect(status.state).toBe('refused')
    expect(lines.at(-1)).toMatch(/: refused \(the server refused the bot token/) // a new cause is news at once
    status.connected()
    expect(lines.at(-1)).toBe('connector a1/meepachat: connected (after 3600 s down)')
    expect(status.problem()).toBeUndefined()
  })
})
