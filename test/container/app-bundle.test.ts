import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {expect, it} from 'vitest'
import {containerImageContext} from '../../src/runtime/container/context.js'
import {assembleAppBundle} from '../../src/sandbox/docker/app-bundle.js'

// The isolation image holds what starts agent-run and nothing else of the app: a container runs
// only agent-run, and the gateway's own code and dependencies (connectors, dashboard, CLI) have
// no business in reach of the agent's commands.
it('the isolation image gets agent-run, the packages it loads and the sandbox helper, and nothing else of the app', async () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bundle-home-'))
  const bundle = await assembleAppBundle(containerImageContext(home).app, 'FROM scratch\n')
  try {
    const files = fs.readdirSync(path.join(bundle.dir, 'app'), {recursive: true, encoding: 'utf8'}).concat(
      fs.readdirSync(path.join(bundle.dir, 'deps'), {recursive: true, encoding: 'utf8'}),
    )
    expect(files).toEqual(expect.arrayContaining([
      'bin/run.js',
      'dist/agent-run.cjs',
      'dist/agent-run.cjs.v8cache',
      'dist/native/meepa-sandbox',
      'node_modules/better-sqlite3/build/Release/better_sqlite3.node',
      'node_modules/bindings/bindings.js',
    ]))
    expect(files.filter((file) => /^(dist\/(commands|runtime\/(gateway|connectors|captain))|node_modules\/(@oclif|discord\.js|@slack|execa|ajv))\//.test(file))).toEqual([])
    expect(bundle.bytes).toBeLessThan(20e6 + fs.statSync(process.execPath).size)
  } finally {
    await bundle.remove()
    fs.rmSync(home, {recursive: true, force: true})
  }
})
