import {describe, expect, it} from 'vitest'
import {splitMessage} from '../../../src/runtime/connectors/split-message.js'
import {seededRandom} from '../../helpers/seeded-random.js'

const FENCE = /^ {0,3}(```|~~~)/

/** Fence lines in a chunk: an even number means every block it opens, it closes. */
function fenceLines(chunk: string): string[] {
  return chunk.split('\n').filter((line) => FENCE.test(line))
}

/** The chunks with the fences the splitter added taken out again: the words of the original, in order. */
function words(text: string): string[] {
  return text.split(/\s+/).filter((word) => word && !FENCE.test(word))
}

describe('splitMessage', () => {
  it('keeps short text whole', () => {
    expect(splitMessage('hello', 10)).toEqual(['hello'])
  })

  it('cuts long text into ordered chunks within the limit, preferring line breaks', () => {
    const text = Array.from({length: 300}, (_, i) => `line ${i} ${'x'.repeat(i % 40)}`).join('\n')
    const chunks = splitMessage(text, 2000)
    expect(chunks.length).toBeGreaterThan(1)
    for (const chunk of chunks) expect(chunk.length).toBeLessThanOrEqual(2000)
    expect(chunks.join('\n')).toBe(text)
  })

  it('cuts between paragraphs before it cuts inside one', () => {
    const paragraph = (n: number) => `Paragraph ${n}. ${'Some words here. '.repeat(10).trim()}`
    const text = [1, 2, 3, 4].map(paragraph).join('\n\n')
    const chunks = splitMessage(text, 2 * paragraph(1).length + 10)
    expect(chunks).toEqual([`${paragraph(1)}\n\n${paragraph(2)}`, `${paragraph(3)}\n\n${paragraph(4)}`])
  })

  it('hard-cuts text with no spaces without splitting a surrogate pair', () => {
    const text = `a${'😀'.repeat(10)}`
    const chunks = splitMessage(text, 4)
    for (const chunk of chunks) expect(chunk.length).toBeLessThanOrEqual(4)
    expect(chunks.join('')).toBe(text)
    for (const chunk of chunks) expect(chunk).not.toMatch(/[\ud800-\udbff]$/)
  })

  it('moves a code block that fits into the next chunk rather than cutting it', () => {
    const code = '```js\nconst a = 1\nconst b = 2\n```'
    const text = `${'intro '.repeat(12).trim()}\n\n${code}\n\nafter`
    const chunks = splitMessage(text, 80)
    expect(chunks[0]).toBe('intro '.repeat(12).trim())
    expect(chunks[1]).toBe(`${code}\n\nafter`)
  })

  it('closes a code block it must cut and reopens it with the same language tag', () => {
    const body = Array.from({length: 80}, (_, i) => `print("line ${i}")`).join('\n')
    const text = `Here is the script:\n\n\`\`\`python\n${body}\n\`\`\`\n\nRun it with python3.`
    const chunks = splitMessage(text, 500)
    expect(chunks.length).toBeGreaterThan(3)
    for (const chunk of chunks) {
      expect(chunk.length).toBeLessThanOrEqual(500)
      expect(fenceLines(chunk).length % 2, chunk).toBe(0)
    }
    for (const chunk of chunks.slice(1, -1)) {
      expect(chunk.startsWith('```python\n'), chunk).toBe(true)
      expect(chunk.endsWith('\n```'), chunk).toBe(true)
    }
    expect(chunks.at(-1)).toMatch(/```\n\nRun it with python3\.$/)
    expect(words(chunks.join('\n'))).toEqual(words(text))
  })

  it('keeps every fence balanced, every chunk within the limit and every word in order (generated replies)', () => {
    for (let seed = 1; seed <= 200; seed++) {
      const random = seededRandom(seed)
      const pick = (n: number) => Math.floor(random() * n)
      const parts: string[] = []
      for (let block = 0; block < 2 + pick(8); block++) {
        const lines = Array.from({length: 1 + pick(30)}, () =>
          Array.from({length: 1 + pick(12)}, () => 'x'.repeat(1 + pick(9))).join(' '),
        )
        if (random() < 0.4) parts.push(`${random() < 0.5 ? '~~~' : '```'}${['', 'ts', 'sh'][pick(3)]}`)
        const fenced = parts.at(-1)?.match(/^(```|~~~)/)?.[1]
        parts.push(lines.join('\n'))
        if (fenced) parts.push(fenced)
        parts.push('')
      }
      const text = parts.join('\n').trim()
      const limit = 60 + pick(400)
      const chunks = splitMessage(text, limit)
      const context = `seed ${seed}, limit ${limit}`
      for (const chunk of chunks) {
        expect(chunk.length, context).toBeLessThanOrEqual(limit)
        expect(fenceLines(chunk).length % 2, `${context}:\n${chunk}`).toBe(0)
        expect(chunk.trim(), context).not.toBe('')
      }
      expect(words(chunks.join('\n')), context).toEqual(words(text))
    }
  })
})
