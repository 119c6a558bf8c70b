import {runCommand} from '@oclif/test'
import fs from 'node:fs'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {loadConfig, parseConfigText} from '../../../src/runtime/config/load.js'
import {GatewayError} from '../../../src/runtime/util/errors.js'
import {makeHome, type TestHome} from '../../helpers/home.js'

const provider = {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: 'http://127.0.0.1:1/v1'}

function problemsOf(yaml: string, env: NodeJS.ProcessEnv = {}): string[] {
  try {
    parseConfigText(yaml, 'config.yaml', env)
  } catch (error) {
    expect(error).toBeInstanceOf(GatewayError)
    expect((error as GatewayError).code).toBe('E_CONFIG')
    return (error as GatewayError).details.problems as string[]
  }
  throw new Error('expected the config to be rejected')
}

describe('config validation', () => {
  it('reports three distinct errors at once, each with its path', () => {
    const problems = problemsOf(`
providers:
  primary: fake
  providers:
    fake: {kind: openai, model: m}
agents:
  - id: ok-agent
  - id: Bad_Id
    container_mode: {memory_limit: lots}
  - id: third
    file_access: {allow_network: maybe}
`)
    expect(problems).toEqual(
      expect.arrayContaining([
        'agents[1].id: must match ^[a-z0-9][a-z0-9-]{0,62}$',
        'agents[1].container_mode.memory_limit: must match ^[0-9]+[kmg]$',
        'agents[2].file_access.allow_network: must be boolean',
      ]),
    )
    expect(problems).toHaveLength(3)
  })

  it('refuses an engine reached over tcp:// without TLS unless insecure: true, and unknown engine names', () => {
    const problems = problemsOf(`
providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
engines:
  - {name: plain, host: "tcp://10.0.0.5:2375"}
  - {name: both, host: "unix:///run/docker.sock", context: other}
  - {name: sock, host: "unix:///run/docker.sock", tls: {ca: /c.pem, cert: /p.pem, key: /k.pem}}
  - {name: open, host: "tcp://10.0.0.6:2375", insecure: true}
  - {name: safe, host: "tcp://10.0.0.7:2376", tls: {ca: /c.pem, cert: /p.pem, key: /k.pem}}
agents:
  - id: a
    container_mode: {engines: [safe, nowhere]}
`)
    expect(problems).toEqual([
      'engines[0].host: tcp://10.0.0.5:2375 without tls: {ca, cert, key} lets anyone who reaches the port run anything on that machine; add tls (mutual TLS), or set insecure: true to accept that',
      'engines[1]: give exactly one of host (unix://, tcp://, ssh://) or context (a docker context name)',
      'engines[2].tls: only a tcp:// host speaks TLS',
      'agents[0].container_mode.engines: "nowhere" is not in engines: (known: plain, both, sock, open, safe)',
    ])
  })

  it('takes ssh:// hosts and contexts, but no password in the URL, and ssh: only where ssh is used', () => {
    const problems = problemsOf(`
providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
engines:
  - {name: far, host: "ssh://meepa@far.example:2222", ssh: {known_hosts: /etc/meepa/known_hosts, identity: /etc/meepa/id}}
  - {name: ctx, context: builder, ssh: {known_hosts: /etc/meepa/known_hosts}}
  - {name: pass, host: "ssh://meepa:hunter2@far.example"}
  - {name: tcp, host: "tcp://10.0.0.7:2376", tls: {ca: /c.pem, cert: /p.pem, key: /k.pem}, ssh: {identity: /id}}
  - {name: ctxtls, context: other, tls: {ca: /c.pem, cert: /p.pem, key: /k.pem}}
agents: [{id: a}]
`)
    expect(problems).toEqual([
      'engines[2].host: a password in an ssh:// URL would be in every ssh command line; remove it and log in with a key (ssh.identity)',
      'engines[3].ssh: only an ssh:// host (or a context that names one) is reached over ssh',
      'engines[4].tls: a context brings its own TLS files (docker context create --docker host=…,ca=…,cert=…,key=…)',
    ])
  })

  it('resolves engines with their defaults; none configured means the local engine only', () => {
    const text = (engines: string) => `
providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
${engines}
agents: [{id: a}]
`
    const {config} = parseConfigText(
      text('engines: [{name: far, host: "tcp://10.0.0.7:2376", tls: {ca: /c.pem, cert: /p.pem, key: /k.pem}}]'),
      'config.yaml',
      {},
    )
    expect(config.engines).toEqual([
      expect.objectContaining({name: 'far', kind: 'docker', max_runs: 8, insecure: false}),
    ])
    expect(parseConfigText(text(''), 'config.yaml', {}).config.engines).toBeUndefined()
  })

  it('config check flags an engine reached without TLS', async () => {
    const previous = process.env.MEEPAGATEWAY_HOME
    const home = makeHome()
    process.env.MEEPAGATEWAY_HOME = home.home
    try {
      home.writeConfig({
        providers: {primary: 'fake', providers: {fake: provider}},
        engines: [{name: 'open', host: 'tcp://10.0.0.6:2375', insecure: true}],
        agents: [{id: 'a'}],
      })
      const checked = await runCommand('config check')
      expect(checked.error).toBeUndefined()
      expect(checked.stderr).toContain('warning: engine open: reached without TLS (insecure: true)')
    } finally {
      process.env.MEEPAGATEWAY_HOME = previous
      home.cleanup()
    }
  })

  it("config check says when an engine's docker context cannot be used, and why", async () => {
    const previous = {home: process.env.MEEPAGATEWAY_HOME, dockerConfig: process.env.DOCKER_CONFIG}
    const home = makeHome()
    process.env.MEEPAGATEWAY_HOME = home.home
    process.env.DOCKER_CONFIG = path.join(home.home, 'docker-config') // never the real ~/.docker
    try {
      home.writeConfig({
        providers: {primary: 'fake', providers: {fake: provider}},
        engines: [{name: 'ctx', context: 'nowhere'}],
        agents: [{id: 'a'}],
      })
      const checked = await runCommand('config check')
      expect(checked.error).toBeUndefined()
      expect(checked.stderr).toMatch(
        /warning: engine ctx: engines\[\]\.context nowhere .*context not found.*docker context create/,
      )
    } finally {
      process.env.MEEPAGATEWAY_HOME = previous.home
      if (previous.dockerConfig === undefined) delete process.env.DOCKER_CONFIG
      else process.env.DOCKER_CONFIG = previous.dockerConfig
      home.cleanup()
    }
  })

  it('checks container_mode.cpus, container_mode.user and file_access.allow_listen', () => {
    const problems = problemsOf(`
providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
agents:
  - id: a
    container_mode: {cpus: 0, user: root}
    file_access: {allow_listen: sometimes}
  - id: b
    container_mode: {cpus: 1.5, user: "1000:1000"}
    file_access: {allow_listen: true}
`)
    expect(problems).toEqual([
      'agents[0].container_mode.cpus: must be > 0',
      'agents[0].container_mode.user: must match ^[0-9]+(:[0-9]+)?$',
      'agents[0].file_access.allow_listen: must be boolean',
    ])
  })

  it('names unknown fields and unknown providers', () => {
    expect(
      problemsOf(
        `providers: {primary: nope, providers: {fake: {kind: openai, model: m}}}\nagents: [{id: a, colour: red}]`,
      ),
    ).toEqual(['agents[0]: unknown field "colour"'])
    expect(
      problemsOf(
        `providers: {primary: nope, fallback: [also-nope], providers: {fake: {kind: openai, model: m}}}\nagents: []`,
      ),
    ).toEqual([
      'providers.primary: "nope" is not defined in providers.providers',
      'providers.fallback[0]: "also-nope" is not defined in providers.providers',
    ])
  })

  it('reads $NAME and ${NAME} from the environment and says which variable is missing', () => {
    const yaml = `providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
agents:
  - id: a
    connectors:
      - {type: discord, bot_token: $DISCORD_TOKEN}
      - {type: slack, bot_token: '\${SLACK_BOT}', app_token: $SLACK_APP}`
    expect(problemsOf(yaml, {DISCORD_TOKEN: 'discord-secret-value'})).toEqual([
      'agents[0].connectors[1].bot_token: environment variable SLACK_BOT is not set',
      'agents[0].connectors[1].app_token: environment variable SLACK_APP is not set',
    ])
    const {config, secrets} = parseConfigText(yaml, 'c', {
      DISCORD_TOKEN: 'discord-secret-value',
      SLACK_BOT: 'xoxb-1',
      SLACK_APP: 'xapp-1',
    })
    expect(config.agents[0]?.connectors[0]).toEqual({type: 'discord', bot_token: 'discord-secret-value', guild_ids: []})
    expect(secrets).toEqual({DISCORD_TOKEN: 'discord-secret-value', SLACK_BOT: 'xoxb-1', SLACK_APP: 'xapp-1'})
  })

  it('resolves agent field > agent_defaults > built-in default, merging nested sections per field', () => {
    const {config} = parseConfigText(
      `providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
agent_defaults:
  max_iterations: 7
  container_mode: {memory_limit: 1g, network: none}
agents:
  - id: a
  - id: b
    max_iterations: 3
    container_mode: {network: host}`,
      'c',
      {},
    )
    const [a, b] = config.agents
    expect(a?.max_iterations).toBe(7)
    expect(a?.container_mode).toMatchObject({memory_limit: '1g', network: 'none', timeout_seconds: 300, enabled: false})
    expect(b?.max_iterations).toBe(3)
    expect(b?.container_mode).toMatchObject({memory_limit: '1g', network: 'host'})
    expect(b?.file_access.allow_network).toBe(true)
    expect(config.captain).toEqual({enabled: true, bind: '127.0.0.1', port: 63372, allowed_hosts: []})
  })

  it('one limits section for every level: containers take memory, pids and CPUs from it unless container_mode says otherwise', () => {
    const {config} = parseConfigText(
      `providers: {primary: fake, providers: {fake: {kind: openai, model: m}}}
agent_defaults:
  limits: {memory: 1g, pids: 100, cpus: 3}
agents:
  - id: a
  - id: b
    container_mode: {memory_limit: 2g, pids_limit: 50, cpus: 2}`,
      'c',
      {},
    )
    const [a, b] = config.agents
    expect(a?.container_mode).toMatchObject({memory_limit: '1g', pids_limit: 100, cpus: 3})
    expect(b?.container_mode).toMatchObject({memory_limit: '2g', pids_limit: 50, cpus: 2})
    expect(b?.limits).toMatchObject({memory: '1g', pids: 100, cpus: 3, disk: '1g'})
  })

  it('reports YAML syntax errors with their line', () => {
    const [problem] = problemsOf('providers: {primary: fake\nagents: [')
    expect(problem).toMatch(/line \d+/)
  })
})

describe('config commands', () => {
  let home: TestHome
  let savedEnv: NodeJS.ProcessEnv
  beforeEach(() => {
    home = makeHome()
    savedEnv = {...process.env}
    process.env.MEEPAGATEWAY_HOME = home.home
    delete process.env.ANTHROPIC_API_KEY // whatever the machine running the tests has
  })
  afterEach(() => {
    process.env = savedEnv
    home.cleanup()
  })

  it('writes a commented default config on first use, says where and which key to set, and never overwrites it', async () => {
    const first = await runCommand('config check')
    expect(first.error).toBeUndefined()
    expect(first.stderr).toContain(`Created a default config at ${home.configPath}`)
    expect(first.stderr).toContain('Set ANTHROPIC_API_KEY')
    const text = fs.readFileSync(home.configPath, 'utf8')
    expect(text).toMatch(/^# meepagateway configuration/)
    expect(loadConfig({home: home.home}).config.agents.map((agent) => agent.id)).toEqual(['meepa'])
    fs.rmSync(home.configPath)
    process.env.ANTHROPIC_API_KEY = 'sk-ant-already-set'
    expect((await runCommand('config check')).stderr).not.toContain('Set ANTHROPIC_API_KEY') // only when it is missing
    fs.appendFileSync(home.configPath, '\n# operator edit\n')
    const second = await runCommand('config check')
    expect(second.stderr).not.toContain('Created a default config')
    expect(fs.readFileSync(home.configPath, 'utf8')).toContain('# operator edit')
  })

  it('masks secrets in config check, in text and --json', async () => {
    process.env.MEEPA_TEST_TOKEN = 'super-secret-discord-token'
    home.writeConfig({
      providers: {primary: 'fake', providers: {fake: provider}},
      agents: [{id: 'a', connectors: [{type: 'discord', bot_token: '$MEEPA_TEST_TOKEN'}]}],
    })
    try {
      const text = await runCommand('config check')
      expect(text.stdout).toContain('bot_token: "********"')
      expect(text.stdout).not.toContain('super-secret-discord-token')
      const json = await runCommand('config check --json')
      expect(json.stdout).not.toContain('super-secret-discord-token')
      expect(JSON.parse(json.stdout).secrets).toEqual(expect.arrayContaining([{name: 'MEEPA_TEST_TOKEN', set: true}]))
    } finally {
      delete process.env.MEEPA_TEST_TOKEN
    }
  })

  it('config check warns about a MeepaChat connector with tls_verify: false, and only that one', async () => {
    home.writeConfig({
      providers: {primary: 'fake', providers: {fake: provider}},
      agents: [
        {
          id: 'a',
          connectors: [
            {type: 'meepachat', url: 'wss://chat.example/api/bot-gateway', bot_token: '1.x'},
            {type: 'meepachat', url: 'wss://self-signed.example/api/bot-gateway', bot_token: '1.y', tls_verify: false},
          ],
        },
      ],
    })
    const text = await runCommand('config check')
    expect(text.stderr).toMatch(
      /warning: agent a: connectors\[1\] \(meepachat wss:\/\/self-signed\.example\/api\/bot-gateway\): tls_verify is off/,
    )
    expect(text.stderr).not.toContain('chat.example/')
    const json = JSON.parse((await runCommand('config check --json')).stdout)
    expect(json.warnings).toEqual([
      expect.objectContaining({agent: 'a', warning: expect.stringContaining('tls_verify is off')}),
    ])
  })

  it('exits 3 with the path of each problem for an invalid config, also under --json', async () => {
    home.writeConfig({
      providers: {primary: 'fake', providers: {fake: provider}},
      agents: [{id: 'a', max_iterations: 0}],
    })
    const {error} = await runCommand('config check')
    expect(error?.oclif?.exit).toBe(3)
    expect(error?.message).toContain('agents[0].max_iterations: must be >= 1')
    const json = await runCommand('config check --json')
    const parsed = JSON.parse(json.stdout)
    expect(parsed.error).toMatchObject({code: 'E_CONFIG', exitCode: 3})
    expect(parsed.error.details.problems).toEqual(['agents[0].max_iterations: must be >= 1'])
  })

  it('refuses a --config path that does not exist instead of creating it', async () => {
    const {error} = await runCommand(`config check --config ${home.home}/nope.yaml`)
    expect(error?.oclif?.exit).toBe(3)
    expect(error?.message).toContain('config file not found')
    expect(fs.existsSync(`${home.home}/nope.yaml`)).toBe(false)
  })

  it('prints a JSON Schema that validates the default config', async () => {
    const {stdout} = await runCommand('config schema')
    const schema = JSON.parse(stdout)
    expect(schema.properties.agents.items.properties.id.pattern).toBe('^[a-z0-9][a-z0-9-]{0,62}$')
  })
})
