import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {loadConfig, resolveAgent} from '../../../src/runtime/config/load.js'
import type {LoadedConfig} from '../../../src/runtime/config/types.js'
import {sandboxConfigWarnings} from '../../../src/runtime/host-sandbox/config-warnings.js'
import {NO_NAMESPACES_ENV, probeNamespaces} from '../../../src/sandbox/bwrap/namespaces.js'
import {makeEscapeWorld, type EscapeWorld} from '../../helpers/landlock-support.js'

// config check probes bubblewrap synchronously (a one-shot command): the warnings must be those of
// the layer the probe finds, for either answer, and the probe the one runs use.
describe.skipIf(process.platform !== 'linux')('sandboxConfigWarnings', () => {
  let world: EscapeWorld
  let loaded: LoadedConfig
  beforeAll(() => {
    world = makeEscapeWorld('http://127.0.0.1:9/v1', {
      id: 'lenient',
      file_access: {deny: ['private'], best_effort: true},
    })
    fs.mkdirSync(path.join(world.workspace('lenient'), 'private'), {recursive: true})
    fs.mkdirSync(world.workspace('broken'), {recursive: true})
    loaded = loadConfig({home: world.home})
    // a deny over its own workspace: the agent could not run, its policy does not compile
    loaded.config.agents.push(resolveAgent({id: 'broken', file_access: {deny: ['.']}} as never, {}))
  })
  afterAll(() => world.cleanup())

  const withoutNamespaces = async <T>(fn: () => Promise<T>): Promise<T> => {
    process.env[NO_NAMESPACES_ENV] = '1'
    try {
      return await fn()
    } finally {
      delete process.env[NO_NAMESPACES_ENV]
    }
  }
  const broken = {
    agent: 'broken',
    warning: expect.stringMatching(
      /^the sandbox policy cannot be compiled: file_access deny: \. covers the agent workspace/,
    ),
  }

  it('the probe finds the layer here, and says why when it is off', async () => {
    expect(await probeNamespaces()).toMatchObject({available: true})
    expect(await withoutNamespaces(() => probeNamespaces())).toMatchObject({
      available: false,
      reason: expect.stringContaining(NO_NAMESPACES_ENV),
    })
  })

  it('with the namespace layer: only what cannot compile', async () => {
    expect(await sandboxConfigWarnings(loaded)).toEqual([broken])
  })

  it('without it: the lowered writable directories too, refused or accepted by best_effort', async () => {
    const warnings = await withoutNamespaces(() => sandboxConfigWarnings(loaded))
    const locked = fs.realpathSync(world.workspace('locked'))
    const lenient = fs.realpathSync(world.workspace('lenient'))
    expect(warnings).toEqual(
      expect.arrayContaining([
        {
          agent: 'locked',
          warning: expect.stringMatching(
            new RegExp(
              `^${locked} loses create, rename and delete rights .*namespace layer .* is unavailable: disabled by ${NO_NAMESPACES_ENV} \\(runs are refused unless file_access.best_effort: true\\)$`,
            ),
          ),
        },
        {
          agent: 'lenient',
          warning: expect.stringMatching(
            new RegExp(`^${lenient} loses create, rename and delete rights .*\\(accepted: best_effort is on\\)$`),
          ),
        },
        broken,
      ]),
    )
    // without the layer nothing refuses chmod, chown or utimes outside the grants: every agent is
    // told, refused or accepted
    const metadata = (agent: string, verdict: string) => ({
      agent,
      warning: expect.stringMatching(
        new RegExp(
          `^file metadata outside the writable grants .* is not protected: .*disabled by ${NO_NAMESPACES_ENV} \\(${verdict}\\)$`,
        ),
      ),
    })
    expect(warnings).toEqual(
      expect.arrayContaining([
        metadata('open', 'runs are refused unless file_access.best_effort: true'),
        metadata('locked', 'runs are refused unless file_access.best_effort: true'),
        metadata('lenient', 'accepted: best_effort is on'),
      ]),
    )
    expect(warnings.filter((warning) => warning.agent === 'open')).toHaveLength(1)
  })
})
