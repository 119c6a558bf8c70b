import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {expect, it} from 'vitest'
import {containerImageContext} from '../../../src/runtime/container/context.js'
import {AGENT_RUN_FILES} from '../../../src/runtime/agent-run/bundle.js'
import {
  APP_DIGEST_RECORD,
  assembleAppBundle,
  computeAppHash,
  recordAppDigest,
} from '../../../src/sandbox/docker/app-bundle.js'

// The isolation image holds what starts agent-run and nothing else of the app: a container runs
// only agent-run, and the gateway's own code and dependencies (connectors, dashboard, CLI) have
// no business in reach of the agent's commands.
it('the isolation image gets agent-run, the packages it loads and the sandbox helper, and nothing else of the app', async () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bundle-home-'))
  const bundle = await assembleAppBundle(containerImageContext(home).app, 'FROM scratch\n')
  try {
    const files = fs
      .readdirSync(path.join(bundle.dir, 'app'), {recursive: true, encoding: 'utf8'})
      .concat(fs.readdirSync(path.join(bundle.dir, 'deps'), {recursive: true, encoding: 'utf8'}))
    expect(files).toEqual(
      expect.arrayContaining([
        'bin/run.js',
        'dist/agent-run.cjs',
        'dist/agent-run.cjs.v8cache',
        'dist/agent-run-providers.cjs',
        'dist/native/meepa-sandbox',
        'node_modules/better-sqlite3/build/Release/better_sqlite3.node',
      ]),
    )
    // better-sqlite3's JavaScript is in the bundle and its addon is loaded by path: no `bindings` lookup package either
    expect(
      files.filter((file) =>
        /^(dist\/(commands|runtime\/(gateway|connectors|captain))|node_modules\/(@oclif|discord\.js|@slack|execa|ajv|bindings|file-uri-to-path))\//.test(
          file,
        ),
      ),
    ).toEqual([])
    expect(bundle.bytes).toBeLessThan(20e6 + fs.statSync(process.execPath).size)
  } finally {
    await bundle.remove()
    fs.rmSync(home, {recursive: true, force: true})
  }
})

// `container status` and every cold container run check the isolation image against this hash:
// the build's record spares reading the bundle, but only while every file is as the build left it.
it("the app hash uses the build's record of the files' digest only while every file matches it", async () => {
  const appRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-app-digest-'))
  const write = (file: string, content: string) => {
    fs.mkdirSync(path.dirname(path.join(appRoot, file)), {recursive: true})
    fs.writeFileSync(path.join(appRoot, file), content)
  }
  try {
    for (const file of Object.values(AGENT_RUN_FILES)) write(file, `content of ${file}`)
    write(AGENT_RUN_FILES.packages, '[]')
    write('dist/native/meepa-sandbox', 'helper')
    const source = {appRoot, nodePath: process.execPath}
    const fresh = await computeAppHash(source)
    await recordAppDigest(appRoot)
    expect(await computeAppHash(source)).toBe(fresh)

    // the record is what is used while the files match it (a forged digest shows through)...
    const record = JSON.parse(fs.readFileSync(path.join(appRoot, APP_DIGEST_RECORD), 'utf8'))
    fs.writeFileSync(path.join(appRoot, APP_DIGEST_RECORD), JSON.stringify({...record, digest: 'forged'}))
    const forged = await computeAppHash(source)
    expect(forged).not.toBe(fresh)
    // ...a rewritten code cache (its content is not part of the hash) does not stop that
    write(AGENT_RUN_FILES.codeCache, 'another cache')
    expect(await computeAppHash(source)).toBe(forged)

    // a changed file or an added one: the files are read again and the record is ignored
    write(AGENT_RUN_FILES.bundle, 'a new bundle')
    const changed = await computeAppHash(source)
    fs.rmSync(path.join(appRoot, APP_DIGEST_RECORD))
    expect(await computeAppHash(source)).toBe(changed)
    expect(changed).not.toBe(fresh)
    await recordAppDigest(appRoot)
    write('dist/native/extra', 'x')
    const added = await computeAppHash(source)
    fs.rmSync(path.join(appRoot, APP_DIGEST_RECORD))
    expect(await computeAppHash(source)).toBe(added)
    expect(added).not.toBe(changed)
  } finally {
    fs.rmSync(appRoot, {recursive: true, force: true})
  }
})
