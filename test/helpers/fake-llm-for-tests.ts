import {afterAll, beforeAll, beforeEach} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'

/**
 * One fake LLM for the tests of the file (or `describe` block) this is called in: started before
 * them and handed to `use`, closed after them. `resetBeforeEach` empties its script and request
 * log before every test, so no test sees another's turns.
 */
export function fakeLlmForTests(use: (llm: FakeLlm) => void, options: {resetBeforeEach?: boolean} = {}): void {
  let llm: FakeLlm | undefined
  beforeAll(async () => {
    llm = await startFakeLlm()
    use(llm)
  })
  afterAll(async () => {
    await llm?.close()
  })
  if (options.resetBeforeEach) beforeEach(() => llm?.reset())
}
