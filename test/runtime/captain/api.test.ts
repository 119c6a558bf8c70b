import fs from 'node:fs'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {ConfigChange} from '../../../src/runtime/captain/index.js'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import {captainConfig, sessionHeaders, startCaptain, type CaptainHarness} from './helpers.js'
import {successfulOutput} from '../../helpers/agent-run-output.js'

const agents = [
  {
    id: 'meepa',
    name: 'Meepa',
    connectors: [{type: 'discord', bot_token: 'discord-token-secret-value', guild_ids: ['42']}],
  },
  {id: 'boxed', container_mode: {enabled: true}},
]

describe('captain JSON API', () => {
  let harness: CaptainHarness
  let headers: Record<string, string>
  const start = async (config = captainConfig(agents)) => {
    harness = await startCaptain({config})
    headers = sessionHeaders(await harness.login())
  }
  afterEach(() => harness?.close())

  it('lists agents with their isolation level and connectors, never the connector tokens', async () => {
    await start()
    const res = await harness.request('GET', '/api/captain/agents', {headers})
    expect(res.status).toBe(200)
    expect(res.body.map((agent: any) => [agent.id, agent.isolation])).toEqual([
      ['meepa', 'host-sandbox'],
      ['boxed', 'container'],
    ])
    expect(res.body[0].connectors).toEqual([
      {name: 'meepa/discord', type: 'discord', state: 'not running', guild_ids: ['42']},
    ])
    const detail = await harness.request('GET', '/api/captain/agents/meepa', {headers})
    expect(detail.body.file_access.unrestricted).toBe(false)
    expect(JSON.stringify(res.body) + JSON.stringify(detail.body)).not.toContain('discord-token-secret-value')
    expect((await harness.request('GET', '/api/captain/agents/nobody', {headers})).status).toBe(404)
  })

  it('shows the live state of each connector the gateway runs', async () => {
    harness = await startCaptain({
      config: captainConfig(agents),
      deps: {connectors: () => [{name: 'meepa/discord', type: 'discord', agentId: 'meepa', state: 'connected'}]},
    })
    headers = sessionHeaders(await harness.login())
    const res = await harness.request('GET', '/api/captain/agents/meepa', {headers})
    expect(res.body.connectors[0]).toMatchObject({name: 'meepa/discord', state: 'connected'})
  })

  it('shows why a connector is not connected and when it tries again', async () => {
    const next = new Date('2026-12-04T10:00:05.000Z')
    const problem =
      'refused: Discord refused the bot token (TokenInvalid); check bot_token; next attempt at 2026-12-04T10:00:05.000Z'
    harness = await startCaptain({
      config: captainConfig(agents),
      deps: {
        connectors: () => [
          {name: 'meepa/discord', type: 'discord', agentId: 'meepa', state: 'refused', problem, nextAttempt: next},
        ],
      },
    })
    headers = sessionHeaders(await harness.login())
    const res = await harness.request('GET', '/api/captain/agents/meepa', {headers})
    expect(res.body.connectors[0]).toMatchObject({
      state: 'refused',
      problem,
      next_attempt_at: '2026-12-04T10:00:05.000Z',
    })
  })

  it('PATCH agents/{id} writes the change to config.yaml (comments kept), warns on unrestricted and tells listeners', async () => {
    await start()
    const changes: ConfigChange[] = []
    harness.captain.onConfigChange((loaded, change) => {
      changes.push(change)
      expect(loaded.config.agents[0]?.file_access.unrestricted).toBe(true)
    })
    const res = await harness.request('PATCH', '/api/captain/agents/meepa', {
      body: {file_access: {unrestricted: true}, max_iterations: 7},
      headers,
    })
    expect(res.status).toBe(200)
    expect(res.body.agent.isolation).toBe('unrestricted')
    expect(res.body.warnings.join(' ')).toMatch(/UNRESTRICTED/)
    expect(res.body.applied).toBe(true)
    expect(changes).toEqual([{section: 'agent', agentId: 'meepa'}])
    const text = fs.readFileSync(harness.home.configPath, 'utf8')
    expect(text).toContain('# operator comment at the top')
    expect(text).toContain('# the base we import locally')
    expect(text).toContain('discord-token-secret-value') // untouched fields stay as written
    expect((await harness.request('GET', '/api/captain/agents/meepa', {headers})).body.max_iterations).toBe(7)
  })

  it('refuses an invalid agent change with the schema problem and leaves config.yaml untouched', async () => {
    await start()
    const before = fs.readFileSync(harness.home.configPath, 'utf8')
    const bad = await harness.request('PATCH', '/api/captain/agents/boxed', {
      body: {container_mode: {memory_limit: 'a lot', network: 'internet'}},
      headers,
    })
    expect(bad.status).toBe(400)
    expect(bad.body.error.code).toBe('E_CONFIG')
    expect(bad.body.error.details.problems).toEqual(
      expect.arrayContaining([
        'agents[1].container_mode.memory_limit: must match ^[0-9]+[kmg]$',
        expect.stringContaining('agents[1].container_mode.network: must be one of'),
      ]),
    )
    const unknown = await harness.request('PATCH', '/api/captain/agents/boxed', {body: {connectors: []}, headers})
    expect(unknown.status).toBe(400)
    expect(unknown.body.error.message).toContain('cannot change this field')
    expect(fs.readFileSync(harness.home.configPath, 'utf8')).toBe(before)
  })

  it('edits the right agent after config.yaml was reordered by hand while the gateway runs', async () => {
    await start()
    const text = fs.readFileSync(harness.home.configPath, 'utf8')
    const lines = text.trimEnd().split('\n')
    // boxed first now
    fs.writeFileSync(harness.home.configPath, [...lines.slice(0, -2), lines.at(-1), lines.at(-2), ''].join('\n'))
    const res = await harness.request('PATCH', '/api/captain/agents/meepa', {body: {name: 'Still Meepa'}, headers})
    expect(res.status).toBe(200)
    const agentsNow = (await harness.request('GET', '/api/captain/agents', {headers})).body
    expect(agentsNow.map((agent: any) => [agent.id, agent.name])).toEqual([
      ['boxed', 'boxed'],
      ['meepa', 'Still Meepa'],
    ])
  })

  it('reads and writes SOUL.md', async () => {
    await start()
    const put = await harness.request('PUT', '/api/captain/agents/meepa/soul', {
      body: {content: '# Soul\nYou are a pirate.\n'},
      headers,
    })
    expect(put.status).toBe(200)
    expect(fs.readFileSync(path.join(harness.home.workspace('meepa'), 'SOUL.md'), 'utf8')).toBe(
      '# Soul\nYou are a pirate.\n',
    )
    const get = await harness.request('GET', '/api/captain/agents/meepa/soul', {headers})
    expect(get.body).toMatchObject({agent_id: 'meepa', content: '# Soul\nYou are a pirate.\n', exists: true})
    expect((await harness.request('PUT', '/api/captain/agents/meepa/soul', {body: {content: 5}, headers})).status).toBe(
      400,
    )
  })

  it('lists run records, newest first, filtered by agent', async () => {
    await start()
    const records = new RunRecords(harness.db)
    records.start({
      id: 'run_a',
      agentId: 'meepa',
      connector: 'webchat',
      channelId: 'c',
      isolation: 'host-sandbox',
      startedAt: 1000,
    })
    records.finish('run_a', successfulOutput('run_a', 'hi'), {durationMs: 5})
    records.reject(
      {id: 'run_b', agentId: 'boxed', connector: 'discord', channelId: 'c', isolation: 'container', startedAt: 2000},
      'E_BUSY',
      'queue full',
    )
    records.files('run_a', [
      {direction: 'in', name: 'shot.png', size: 70, content_type: 'image/png'},
      {direction: 'in', name: 'huge.zip', size: 9e7, content_type: 'application/zip', skipped_reason: 'too large'},
    ])
    const all = await harness.request('GET', '/api/captain/runs', {headers})
    expect(all.body.map((run: any) => [run.id, run.status])).toEqual([
      ['run_b', 'rejected'],
      ['run_a', 'ok'],
    ])
    // each run's files, for the dashboard's Files column: names and sizes, never content
    expect(all.body.map((run: any) => run.files)).toEqual([
      [],
      [
        {direction: 'in', name: 'shot.png', size: 70, content_type: 'image/png', skipped_reason: null},
        {direction: 'in', name: 'huge.zip', size: 9e7, content_type: 'application/zip', skipped_reason: 'too large'},
      ],
    ])
    const one = await harness.request('GET', '/api/captain/runs?agent=meepa', {headers})
    expect(one.body.map((run: any) => run.id)).toEqual(['run_a'])
    expect((await harness.request('GET', '/api/captain/runs?limit=0', {headers})).status).toBe(400)
  })

  it('PUT container/config validates packages with the schema and writes image_config', async () => {
    await start()
    const bad = await harness.request('PUT', '/api/captain/container/config', {
      body: {base_image: 'debian:bookworm-slim', packages: ['curl; rm -rf /']},
      headers,
    })
    expect(bad.status).toBe(400)
    expect(bad.body.error.details.problems[0]).toContain('image_config.packages[0]')
    const good = await harness.request('PUT', '/api/captain/container/config', {
      body: {enabled: true, base_image: 'debian:bookworm-slim', packages: ['jq', 'git'], env_vars: {LANG: 'C.UTF-8'}},
      headers,
    })
    expect(good.status).toBe(200)
    expect(good.body.image_config).toMatchObject({enabled: true, packages: ['jq', 'git'], redact_secrets: true})
    const text = fs.readFileSync(harness.home.configPath, 'utf8')
    expect(text).toContain('packages: [ jq, git ]') // written in the file's own (flow) style
    expect(text).toContain('# operator comment at the top')
    const get = await harness.request('GET', '/api/captain/container/config', {headers})
    expect(get.body.configured.packages).toEqual(['jq', 'git'])
  })

  it('GET container/dockerfile previews the saved settings and a draft, without Docker', async () => {
    await start()
    const saved = await harness.request('GET', '/api/captain/container/dockerfile', {headers})
    expect(saved.status).toBe(200)
    expect(saved.body.dockerfile).toContain('FROM debian:bookworm-slim')
    expect(saved.body.dockerfile).not.toContain('apt-get')
    const draft = encodeURIComponent(JSON.stringify({packages: ['jq']}))
    const preview = await harness.request('GET', `/api/captain/container/dockerfile?draft=${draft}`, {headers})
    expect(preview.body.dockerfile).toContain('apt-get install -y --no-install-recommends jq')
    expect(preview.body.package_manager_source).toBe('name') // no Docker here: guessed from the image name
    expect(preview.body.tag).not.toBe(saved.body.tag)
    const bad = await harness.request(
      'GET',
      `/api/captain/container/dockerfile?draft=${encodeURIComponent(JSON.stringify({packages: ['$(reboot)']}))}`,
      {headers},
    )
    expect(bad.status).toBe(400)
    expect(bad.body.error.message).toContain('is not a package name')
  })

  it('reports Docker problems with the fix instead of failing the status page', async () => {
    await start()
    const status = await harness.request('GET', '/api/captain/container/status', {headers})
    expect(status.status).toBe(200)
    expect(status.body.docker).toMatchObject({ok: false, error: {code: 'E_DOCKER_MISSING'}})
    expect(status.body.docker.error.suggestions.length).toBeGreaterThan(0)
  })

  it('streams a failed build as Server-Sent Events that end with the result', async () => {
    await start()
    const started = await harness.request('POST', '/api/captain/container/build', {body: {}, headers})
    expect(started.status).toBe(202)
    const res = await fetch(harness.url + started.body.events_url, {
      headers: {authorization: headers.authorization as string},
    })
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const text = await res.text() // the server ends the stream with the build
    const events = [...text.matchAll(/id: (\d+)\nevent: (\w+)\ndata: (.*)\n\n/g)].map((m) => ({
      id: Number(m[1]),
      type: m[2],
      data: JSON.parse(m[3] as string),
    }))
    const done = events.at(-1)
    expect(done?.type).toBe('done')
    expect(done?.data).toMatchObject({status: 'failed', error: {code: 'E_DOCKER_MISSING'}})
    expect(events.some((event) => event.type === 'log' && /build failed/.test(event.data.line))).toBe(true)
    // reconnecting after the last seen event replays only what came later
    const again = await (
      await fetch(`${harness.url}${started.body.events_url}?after=${done!.id - 1}`, {
        headers: {authorization: headers.authorization as string},
      })
    ).text()
    expect(again.match(/^event: /gm)).toHaveLength(1)
  })

  it('refuses to delete images the gateway did not build', async () => {
    await start()
    const res = await harness.request(
      'DELETE',
      `/api/captain/container/images/${encodeURIComponent('debian:bookworm-slim')}`,
      {headers},
    )
    expect(res.status).toBe(400)
    expect(res.body.error.message).toContain('not an image the gateway built')
  })

  it('serves the dashboard pages itself, with a strict content security policy', async () => {
    await start()
    const root = await harness.request('GET', '/')
    expect(root.status).toBe(302)
    expect(root.headers.get('location')).toBe('/captain/')
    const page = await harness.request('GET', '/captain/')
    expect(page.status).toBe(200)
    expect(page.headers.get('content-type')).toContain('text/html')
    expect(page.headers.get('content-security-policy')).toContain("default-src 'self'")
    expect(page.body).toContain('/captain/app.js')
    expect(page.body).not.toMatch(/https?:\/\/(?!127)/) // nothing from the internet
    expect((await harness.request('GET', '/captain/app.js')).headers.get('content-type')).toContain('javascript')
    expect((await harness.request('GET', '/captain/..%2fpackage.json')).status).toBe(404)
    expect((await harness.request('GET', '/captain/../package.json')).status).toBe(404)
  })
})
