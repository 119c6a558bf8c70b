/// <reference lib="dom" />
import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, afterEach, beforeAll, beforeEach, expect, it} from 'vitest'
import {loadConfig} from '../../../src/runtime/config/load.js'
import {startGateway, type Gateway} from '../../../src/runtime/gateway/gateway.js'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {dockerMissingReason} from '../../helpers/docker-env.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../helpers/home.js'
import {describeWithChromium, openBrowser, type BrowserSession} from './browser.js'
import {startCaptain} from './helpers.js'
import {CaptainAuthStore} from '../../../src/runtime/captain/auth-store.js'
import {waitFor} from '../../helpers/wait-for.js'

const PASSWORD = 'browser test password'

// The real gateway (dispatcher, web chat, runs through agent-run) with the dashboard, driven by headless Chromium.
describeWithChromium('Captain dashboard in a browser', () => {
  let llm: FakeLlm
  let home: TestHome
  let gateway: Gateway
  let browser: BrowserSession
  const logs: string[] = []

  beforeAll(async () => {
    llm = await startFakeLlm()
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [
          {id: 'meepa', name: 'Meepa', file_access: {unrestricted: true}},
          {id: 'scout', name: 'Scout'},
        ],
        {
          captain: {enabled: true, bind: '127.0.0.1', port: 0},
          image_config: {base_image: 'debian:bookworm-slim', packages: []},
        },
      ),
    )
    const loaded = loadConfig({home: home.home, env: {...process.env, FAKE_LLM_KEY: 'sk-fake-test-key-123456'}})
    gateway = await startGateway({loaded, port: 0, log: (line) => logs.push(line), watchConfig: true})
    // first-time setup with the code the gateway printed, as an operator would
    const code = /setup code ([A-Z0-9-]{11})/.exec(logs.join('\n'))?.[1]
    const setup = await fetch(`${gateway.url}/api/captain/auth/setup`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({code, password: PASSWORD}),
    })
    expect(setup.status).toBe(200)
  })
  afterAll(async () => {
    await gateway?.stop({graceMs: 1000})
    await llm?.close()
    home?.cleanup()
  })
  beforeEach(async () => {
    browser = await openBrowser()
  })
  afterEach(async () => {
    await browser?.close()
  })

  async function logIn(): Promise<void> {
    const {page} = browser
    await page.goto(`${gateway.url}/`)
    await page.fill('#password', PASSWORD)
    await page.click('#login')
    await page.waitForSelector('#agents-table')
  }

  it('logs in (after refusing a wrong password) and shows agents with their isolation and recent runs', async () => {
    const {page} = browser
    await page.goto(`${gateway.url}/`)
    expect(page.url()).toBe(`${gateway.url}/captain/`)
    await page.fill('#password', 'not the password')
    await page.click('#login')
    await page.getByText('wrong password').waitFor()
    await browser.screenshot('captain-login')
    await page.fill('#password', PASSWORD)
    await page.click('#login')
    await page.waitForSelector('#agents-table')
    expect(await page.textContent('tr[data-agent="meepa"]')).toContain('unrestricted')
    expect(await page.textContent('tr[data-agent="scout"]')).toContain('host-sandbox')
    // no cookie at all: the session is a bearer token in this origin's sessionStorage
    expect(await page.evaluate(() => document.cookie)).toBe('')
    expect((await browser.context.cookies()).length).toBe(0)
    expect(await page.evaluate(() => sessionStorage.getItem('captain_token'))).toMatch(/^cps_/)
    await browser.screenshot('captain-overview')
  })

  it('logs in with a one-time `dashboard link` URL and drops the secret from the address bar', async () => {
    const secret = new CaptainAuthStore(gateway.db).createLoginLink()
    const {page} = browser
    await page.goto(`${gateway.url}/captain/#login=${secret}`)
    await page.waitForSelector('#agents-table')
    expect(page.url()).not.toContain(secret)
    // used once: a second browser with the same URL gets the login form
    const second = await openBrowser()
    try {
      await second.page.goto(`${gateway.url}/captain/#login=${secret}`)
      await second.page.getByText('unknown, used or expired').waitFor()
    } finally {
      await second.close()
    }
  })

  it('works under its own CSP: no page uses an inline style the policy would drop', async () => {
    const violations: string[] = []
    browser.page.on('console', (message) => {
      if (/Content Security Policy/i.test(message.text())) violations.push(message.text())
    })
    await logIn()
    const {page} = browser
    for (const nav of ['agent:scout', 'container', 'chat', 'access', 'overview']) {
      await page.click(`a[data-nav="${nav}"]`)
      await page.waitForLoadState('networkidle')
      expect(await page.evaluate(() => document.querySelectorAll('[style]').length), nav).toBe(0)
    }
    expect(violations).toEqual([])
  })

  it('edits the soul and warns clearly before an agent is made unrestricted', async () => {
    await logIn()
    const {page} = browser
    await page.click('a[data-nav="agent:scout"]')
    await page.waitForSelector('#soul')
    expect(await page.isVisible('#unrestricted-warning')).toBe(false)
    await page.check('#unrestricted')
    expect(await page.isVisible('#unrestricted-warning')).toBe(true)
    expect(await page.textContent('#unrestricted-warning')).toContain('NO isolation')
    await page.click('#save-agent')
    await page.getByText('now runs UNRESTRICTED').waitFor()
    expect(loadConfig({home: home.home, env: {FAKE_LLM_KEY: 'x'}}).config.agents[1]?.file_access.unrestricted).toBe(
      true,
    )
    await page.fill('#soul', '# Soul\n\nYou are Scout, a careful explorer.\n')
    await page.click('#save-soul')
    // the agent's first save makes its workspace (a volume of its own under root): wait for the file
    const soulPath = path.join(home.workspace('scout'), 'SOUL.md')
    const soul = await waitFor('SOUL.md saved', () => fs.existsSync(soulPath) && fs.readFileSync(soulPath, 'utf8'))
    expect(soul).toContain('careful explorer')
    await browser.screenshot('captain-agent')
    await page.uncheck('#unrestricted')
    await page.click('#save-agent')
    await page.getByText('Isolation: host-sandbox').waitFor()
  })

  it('adds a package and sees the Dockerfile preview change, then saves it to config.yaml', async () => {
    await logIn()
    const {page} = browser
    await page.click('a[data-nav="container"]')
    await page.waitForFunction(() =>
      document.querySelector('#dockerfile-preview')?.textContent?.includes('FROM debian:bookworm-slim'),
    )
    const before = await page.textContent('#dockerfile-preview')
    const tagBefore = await page.textContent('#dockerfile-tag')
    expect(before).not.toContain('apt-get')
    await page.fill('#package-input', 'jq')
    await page.click('#add-package')
    await page.waitForFunction(() =>
      document
        .querySelector('#dockerfile-preview')
        ?.textContent?.includes('apt-get install -y --no-install-recommends jq'),
    )
    expect(await page.textContent('#dockerfile-tag')).not.toBe(tagBefore)
    expect(await page.textContent('#packages')).toContain('jq')
    await page.click('#save-container')
    await page.getByText('Saved.').waitFor()
    expect(loadConfig({home: home.home, env: {FAKE_LLM_KEY: 'x'}}).config.image_config.packages).toEqual(['jq'])
    // the image panel follows the saved settings
    await page.waitForFunction(
      () =>
        document.querySelector('#dockerfile-tag')?.textContent ===
        `tag: ${document.querySelector('#image-tag')?.textContent}`,
    )
    await browser.screenshot('captain-container-preview')
    // back to no packages, so the build test needs no package mirror
    await page.click('[data-package="jq"] button')
    await page.waitForFunction(() => !document.querySelector('#dockerfile-preview')?.textContent?.includes('apt-get'))
    await page.click('#save-container')
    await page.getByText('Saved.').waitFor()
  })

  it('builds the container image, following the live log to the end, then deletes it', async (context) => {
    if (dockerMissingReason) {
      if (process.env.MEEPA_REQUIRE_DOCKER === '1') throw new Error(`MEEPA_REQUIRE_DOCKER=1 but ${dockerMissingReason}`)
      process.stderr.write(
        `\n!!! SKIPPED the dashboard build test: ${dockerMissingReason}; run scripts/ci/docker-up.sh\n\n`,
      )
      context.skip()
    }
    await logIn()
    const {page} = browser
    await page.click('a[data-nav="container"]')
    await page.waitForSelector('#image-tag')
    // a variable unique to this run gives a tag no earlier run built, so a real build happens
    const marker = `run-${Date.now()}`
    await page.click('#add-env')
    await page.fill('#env-vars .env-name', 'MEEPA_TEST_MARKER')
    await page.fill('#env-vars .env-value', marker)
    await page.waitForFunction(
      (value) =>
        document.querySelector('#dockerfile-preview')?.textContent?.includes(`ENV MEEPA_TEST_MARKER="${value}"`),
      marker,
    )
    const tag = (await page.textContent('#dockerfile-tag'))!.replace('tag: ', '').trim()
    await page.click('#build')
    await page.waitForSelector('#build-log:not([hidden])')
    await page.waitForSelector('#build-result', {timeout: 170_000})
    expect(await page.getAttribute('#build-result', 'data-status')).toBe('succeeded')
    const log = await page.textContent('#build-log')
    expect(log).toContain(`building container image ${tag}`)
    expect(log).toContain(`built ${tag}`)
    await page.waitForSelector(`tr[data-image="${tag}"]`)
    const inspect = await execa('docker', ['image', 'inspect', '--format', '{{json .Config.Env}}', tag], {
      reject: false,
      timeout: 30_000,
    })
    expect(inspect.exitCode).toBe(0)
    expect(inspect.stdout).toContain(`MEEPA_TEST_MARKER=${marker}`)
    await browser.screenshot('captain-container-build')

    await page.click('#delete-image')
    await page.getByText(`Deleted ${tag}.`).waitFor()
    await page.waitForSelector(`tr[data-image="${tag}"]`, {state: 'detached'})
    expect((await execa('docker', ['image', 'inspect', tag], {reject: false, timeout: 30_000})).exitCode).not.toBe(0)
    await browser.screenshot('captain-container-deleted')
  }, 240_000)

  it('chats with an agent through the web chat connector and shows the tool calls and sent files with the reply', async () => {
    llm.reset()
    llm.enqueue(
      {
        toolCalls: [
          {name: 'write_file', arguments: {path: 'note.txt', content: 'written from the dashboard'}},
          {name: 'send_file', arguments: {path: 'note.txt'}},
        ],
      },
      {text: 'I wrote note.txt for you.'},
    )
    await logIn()
    const {page} = browser
    await page.click('a[data-nav="chat"]')
    await page.selectOption('#chat-agent', 'meepa')
    await page.fill('#chat-input', 'please write a note')
    await page.click('#send')
    const reply = page.locator('.msg.agent:not(.pending)')
    await reply.waitFor({timeout: 25_000})
    expect(await reply.textContent()).toContain('I wrote note.txt for you.')
    expect(await page.textContent('.msg.agent .tools')).toContain('write_file')
    // the file it sent, as a download that the browser saves rather than renders
    const link = page.locator('.msg.agent .files a')
    expect(await link.textContent()).toBe('↓ note.txt (26 B)')
    expect(await link.getAttribute('download')).toBe('note.txt')
    expect(fs.readFileSync(path.join(home.workspace('meepa'), 'note.txt'), 'utf8')).toBe('written from the dashboard')
    await browser.screenshot('captain-chat')
    // the run is on the overview with its outcome
    await page.click('a[data-nav="overview"]')
    await page.waitForSelector('tr[data-run]')
    expect(await page.textContent('table.runs tbody tr:first-child')).toMatch(
      /meepa.*webchat.*ok.*↑ note\.txt \(26 B, text\/plain\)/s,
    )
    await browser.screenshot('captain-overview-runs')
  }, 60_000)

  it('creates an admin API key that is shown once, lists it by prefix and revokes it', async () => {
    await logIn()
    const {page} = browser
    await page.click('a[data-nav="access"]')
    await page.fill('#key-name', 'deploy script')
    await page.check('#key-admin')
    await page.click('#create-key')
    const key = (await page.textContent('#new-key'))!.trim()
    expect(key).toMatch(/^cptn_/)
    const row = page.locator('#keys-table tr', {hasText: 'deploy script'})
    expect(await row.textContent()).not.toContain(key)
    expect(await row.textContent()).toContain('admin')
    const chat = () => fetch(`${gateway.url}/api/captain/agents`, {headers: {authorization: `Bearer ${key}`}})
    expect((await chat()).status).toBe(200)
    await browser.screenshot('captain-api-keys')
    await row.getByRole('button', {name: 'Revoke'}).click()
    await page.locator('#keys-table tr', {hasText: 'deploy script'}).getByText('revoked').waitFor()
    expect((await chat()).status).toBe(401)
  })

  it('says on the overview that config.yaml holds a hand edit the gateway refused, until the file is fixed', async () => {
    const written = fs.readFileSync(home.configPath, 'utf8')
    try {
      fs.writeFileSync(home.configPath, `${written}surprise: 1\n`)
      await logIn()
      await browser.page.locator('#config-refused', {hasText: '(root): unknown field "surprise"'}).waitFor()
      expect(await browser.page.textContent('#config-refused')).toContain('still runs the previous config')
    } finally {
      fs.writeFileSync(home.configPath, written)
    }
    await browser.page.reload()
    await browser.page.waitForSelector('#agents-table')
    expect(await browser.page.textContent('#config-refused')).toBe('')
  })
})

describeWithChromium('Captain first-time setup in a browser', () => {
  it('sets the password with the setup code from the terminal and lands on the overview', async () => {
    const harness = await startCaptain({env: {MEEPAGATEWAY_PASSWORD: ''}})
    const browser = await openBrowser()
    try {
      const {page} = browser
      await page.goto(`${harness.url}/setup`)
      await page.waitForSelector('#setup-code')
      await page.fill('#setup-code', 'WRO-NGC-ODE')
      await page.fill('#new-password', 'a fine password')
      await page.fill('#new-password-again', 'a fine password')
      await page.click('button[type=submit]')
      await page.getByText('wrong setup code').waitFor()
      await browser.screenshot('captain-setup')
      await page.fill('#setup-code', harness.captain.setupCode!.toLowerCase())
      await page.click('button[type=submit]')
      await page.waitForSelector('#agents-table')
      expect(
        (await harness.request('POST', '/api/captain/auth/login', {body: {password: 'a fine password'}})).status,
      ).toBe(200)
    } finally {
      await browser.close()
      await harness.close()
    }
  })
})
