import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {chromium, type BrowserContext, type Page} from 'playwright-core'
import {ROOT} from '../../helpers/home.js'
import {describeRequiring} from '../../helpers/describe-requiring.js'

export const CHROMIUM = '/usr/bin/chromium'
export const SCREENSHOTS = path.join(ROOT, 'test-results')

/** The flags the test machine's Chromium needs: no sandbox (root), and no traffic to anything but loopback. */
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

/** `describe` for browser suites: skipped loudly without Chromium, failing under MEEPA_REQUIRE_CHROMIUM=1. */
export function describeWithChromium(name: string, body: () => void): void {
  const missingReason = fs.existsSync(CHROMIUM)
    ? undefined
    : `${CHROMIUM} is missing; install Debian's chromium package (apt-get install chromium)`
  describeRequiring({what: 'Chromium', missingReason, requireEnv: 'MEEPA_REQUIRE_CHROMIUM'}, name, body)
}

export interface BrowserSession {
  page: Page
  context: BrowserContext
  /** Saves test-results/<name>.png (full page) for a reviewer. */
  screenshot(name: string): Promise<string>
  close(): Promise<void>
}

/** A fresh browser profile (own --user-data-dir) per test, so no cookie leaks between tests. */
export async function openBrowser(): Promise<BrowserSession> {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: FLAGS,
    viewport: {width: 1280, height: 860},
    timeout: 30_000,
  })
  const page = context.pages()[0] ?? (await context.newPage())
  page.setDefaultTimeout(15_000)
  const errors: string[] = []
  page.on('pageerror', (error) => errors.push(error.message))
  return {
    page,
    context,
    async screenshot(name) {
      fs.mkdirSync(SCREENSHOTS, {recursive: true})
      const file = path.join(SCREENSHOTS, `${name}.png`)
      await page.screenshot({path: file, fullPage: true})
      if (errors.length > 0) throw new Error(`the page threw: ${errors.join('; ')}`)
      return file
    },
    async close() {
      await context.close()
      fs.rmSync(profile, {recursive: true, force: true})
    },
  }
}
