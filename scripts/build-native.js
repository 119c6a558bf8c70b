#!/usr/bin/env node
// Builds the host sandbox's Landlock helper (native/meepa-sandbox.c) into dist/native/ with the
// system C compiler. Nothing is downloaded. macOS needs no helper (Seatbelt's sandbox-exec ships
// with the OS), so the build is skipped there. Run by `npm run build` (and so by `npm install`).
import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const source = path.join(root, 'native', 'meepa-sandbox.c')
const outDir = path.join(root, 'dist', 'native')
const output = path.join(outDir, 'meepa-sandbox')

function fail(message, fixes) {
  process.stderr.write(`build-native: ${message}\n${fixes.map((fix) => `  Try this: ${fix}\n`).join('')}`)
  process.exit(1)
}

if (process.platform === 'darwin') {
  process.stderr.write('build-native: macOS uses /usr/bin/sandbox-exec, no helper to build\n')
  process.exit(0)
}
if (process.platform !== 'linux') {
  process.stderr.write(`build-native: no host sandbox on ${process.platform}; skipping the helper\n`)
  process.exit(0)
}

const compiler = process.env.CC || 'cc'
const probe = spawnSync(compiler, ['--version'], {encoding: 'utf8', timeout: 30_000})
if (probe.error || probe.status !== 0) {
  fail(`no C compiler found (tried \`${compiler}\`); the Landlock sandbox helper must be compiled on this machine`, [
    'Debian/Ubuntu: sudo apt-get install gcc libc6-dev',
    'Fedora/RHEL: sudo dnf install gcc glibc-devel',
    'Alpine: sudo apk add gcc musl-dev linux-headers',
    'or set CC to your compiler, then run `npm run build:native`',
  ])
}

fs.mkdirSync(outDir, {recursive: true})
const args = ['-O2', '-Wall', '-Wextra', '-Werror', '-std=gnu11', '-o', output, source]
const result = spawnSync(compiler, args, {encoding: 'utf8', timeout: 120_000})
if (result.error || result.status !== 0) {
  fail(`compiling ${path.relative(root, source)} failed:\n${result.stderr || result.error?.message || ''}`, [
    'install the C library headers (Debian/Ubuntu: sudo apt-get install libc6-dev linux-libc-dev)',
  ])
}
fs.chmodSync(output, 0o755)
process.stderr.write(`build-native: built ${path.relative(root, output)}\n`)
