import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {expect, it} from 'vitest'
import {ROOT} from '../helpers/home.js'

const dist = path.join(ROOT, 'dist')

// agent-run runs from one bundled file: a bundle older than the code it was made from would run
// yesterday's agent-run under every isolation level, the same trap as a stale manifest.
it('agent-run is bundled from the current build of its sources', () => {
  const bundled = fs.statSync(path.join(dist, 'agent-run.cjs')).mtimeMs
  const runtime = path.join(dist, 'runtime')
  const stale = fs.readdirSync(runtime, {recursive: true, encoding: 'utf8'})
    .filter((file) => file.endsWith('.js') && fs.statSync(path.join(runtime, file)).mtimeMs > bundled)
  expect(stale).toEqual([])
})

it('this Node accepts the bundle\'s V8 code cache (agent-run starts without compiling it)', async () => {
  const check = "import('./dist/runtime/agent-run/bundle.js').then((bundle) => process.stdout.write(bundle.agentRunCodeCacheStatus()))"
  expect((await execa(process.execPath, ['--input-type=module', '-e', check], {cwd: ROOT})).stdout).toBe('accepted')
})
