import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, expect, it} from 'vitest'
import {ROOT} from '../helpers/home.js'

// docker-up.sh debootstraps the base image from the machine's own Debian mirror (another mirror or an apt proxy works).
let aptEtc: string
beforeEach(() => {
  aptEtc = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-apt-'))
  fs.mkdirSync(path.join(aptEtc, 'sources.list.d'))
})
afterEach(() => fs.rmSync(aptEtc, {recursive: true, force: true}))

const write = (file: string, text: string) => fs.writeFileSync(path.join(aptEtc, file), text)
const mirror = (env: Record<string, string> = {}) =>
  execFileSync('bash', [path.join(ROOT, 'scripts/ci/docker-up.sh'), '--print-mirror'], {
    env: {PATH: process.env.PATH, APT_ETC: aptEtc, ...env},
    encoding: 'utf8',
  }).trim()

it('takes the archive URI of a deb822 .sources file, skipping the security suite and disabled stanzas', () => {
  write(
    'sources.list.d/a-off.sources',
    'Enabled: no\nTypes: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\n',
  )
  write(
    'sources.list.d/debian.sources',
    'Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\nTypes: deb deb-src\n# a comment\nURIs: http://apt-proxy.example:3142/debian\nSuites: bookworm bookworm-updates\nComponents: main\n',
  )
  expect(mirror()).toBe('http://apt-proxy.example:3142/debian')
})

it('takes a one-line sources.list entry with options', () => {
  write(
    'sources.list',
    '# deb http://commented.example/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian bookworm main\n',
  )
  expect(mirror()).toBe('http://ftp.de.debian.org/debian')
})

it('ignores non-Debian sources and falls back to deb.debian.org when no Debian archive is configured', () => {
  write('sources.list.d/nodesource.list', 'deb https://deb.nodesource.com/node_20.x nodistro main\n')
  expect(mirror()).toBe('http://deb.debian.org/debian')
})

it('lets DEBIAN_MIRROR override the apt sources', () => {
  write('sources.list', 'deb http://ftp.de.debian.org/debian bookworm main\n')
  expect(mirror({DEBIAN_MIRROR: 'http://override.example/debian'})).toBe('http://override.example/debian')
})
