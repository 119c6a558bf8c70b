import {execFileSync} from 'node:child_process'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')

/**
 * Processes spawned by tests (agent-run under every runner, `serve`) run the built app, so build
 * it once per test run: a stale dist/ would otherwise test yesterday's code.
 */
export default function setup(): void {
  if (process.env.MEEPA_SKIP_BUILD === '1') return
  const started = Date.now()
  // in place, not `npm run build`: removing dist/ would break other test runs sharing the tree
  execFileSync(process.execPath, [path.join(root, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], {
    cwd: root,
    stdio: 'inherit',
  })
  for (const script of [
    'build-config-validator.js',
    'bundle-agent-run.js',
    'build-native.js',
    'bundle-cli.js',
    'record-app-digest.js',
  ]) {
    execFileSync(process.execPath, [path.join(root, 'scripts', script)], {cwd: root, stdio: 'inherit'})
  }
  process.stderr.write(`[global-setup] built dist/ in ${Date.now() - started} ms\n`)
}
