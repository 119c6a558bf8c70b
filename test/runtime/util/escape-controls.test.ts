import {describe, expect, it} from 'vitest'
import {escapeControls} from '../../../src/runtime/util/escape-controls.js'

describe('escapeControls', () => {
  it('shows every C0 and C1 control, DEL and direction override as an escape', () => {
    expect(escapeControls('a\nb\rc\td')).toBe('a\\nb\\rc\\td')
    expect(escapeControls('\u001b[2J\u001b]0;title\u0007\u0000\u007f\u009b')).toBe(
      '\\x1b[2J\\x1b]0;title\\x07\\x00\\x7f\\x9b',
    )
    expect(escapeControls('evil\u202etxt.exe\u2066')).toBe('evil\\u202etxt.exe\\u2066')
    // line and paragraph separators (a new line to some log viewers) and the Arabic letter mark
    expect(escapeControls('a\u2028b\u2029c\u061cd')).toBe('a\\u2028b\\u2029c\\u061cd')
  })

  it('doubles a backslash: an escape typed out never passes for one', () => {
    expect(escapeControls('forged\\n2026-12-06T00:00:00Z gateway: ok')).toBe(
      'forged\\\\n2026-12-06T00:00:00Z gateway: ok',
    )
    expect(escapeControls('C:\\path\nnext')).toBe('C:\\\\path\\nnext')
  })

  it('leaves everything else as it is', () => {
    const text = 'Docker 24.0.0 (API 1.41) – café ✓ "quoted" 日本'
    expect(escapeControls(text)).toBe(text)
  })
})
