import {Config} from '@oclif/core'
import {expect, it} from 'vitest'

// A leftover oclif.manifest.json, tsx 4.23.15 or TypeScript 7 silently make tests run stale dist/ code.
it('loads commands from src/ in tests (auto-transpile is working)', async () => {
  const config = await Config.load(import.meta.url)
  // oclif sets relativePath on the loaded class; its public type does not declare it
  const command = (await config.findCommand('send', {must: true}).load()) as {relativePath?: string[]}
  expect(command.relativePath?.join('/')).toBe('src/commands/send.ts')
})
