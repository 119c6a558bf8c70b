import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {agentPolicy} from './agent-policy.js'
import {loweringWarnings, namespaceGaps} from '../../sandbox/landlock/enforcement.js'
import {probeNamespaces} from '../../sandbox/bwrap/namespaces.js'
import {probeRecord} from '../util/paths.js'
import type {LoadedConfig} from '../config/types.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import {workspacePath} from '../workspace/location.js'

// Apart from exec.ts on purpose: `config check` loads only this, not what running a command needs
// (execa, the run database).

/**
 * `config check`: the writable directories each host-sandbox agent loses create rights in (a deny
 * beneath them that the namespace layer cannot cover, or no namespace layer at all), and without
 * that layer the file metadata left unprotected outside the grants. Agents whose
 * workspace does not exist yet are skipped: their policy cannot be compiled without it.
 */
export async function sandboxConfigWarnings(loaded: LoadedConfig): Promise<Array<{agent: string; warning: string}>> {
  if (process.platform !== 'linux') return []
  const agents = loaded.config.agents.filter(
    (agent) => isolationLevelFor(agent) === 'host-sandbox' && fs.existsSync(workspacePath(loaded.home, agent.id)),
  )
  if (agents.length === 0) return []
  // bwrap runs while the policies compile for the layer it nearly always finds; compiled again without it if not
  const probing = probeNamespaces({cacheFile: probeRecord(loaded.home, 'namespace')})
  // one private temp dir stands for every agent's: only its existence and place (os.tmpdir()) matter to the policy
  const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-sandbox-check-'))
  const warnings: Array<{agent: string; warning: string}> = []
  try {
    const compileAll = (namespaces: boolean) =>
      agents.map((agent) => {
        try {
          return {
            agent,
            policy: agentPolicy({
              agent,
              config: loaded.config,
              home: loaded.home,
              workspace: workspacePath(loaded.home, agent.id),
              tmpDir,
              configPath: loaded.path,
              namespaces,
            }),
          }
        } catch (error) {
          return {agent, error: error as Error}
        }
      })
    let compiled = compileAll(true)
    const namespaces = await probing
    if (!namespaces.available) compiled = compileAll(false)
    for (const {agent, policy, error} of compiled) {
      if (!policy) {
        warnings.push({agent: agent.id, warning: `the sandbox policy cannot be compiled: ${error?.message}`})
        continue
      }
      const gaps = new Set(namespaceGaps(policy, namespaces))
      for (const warning of namespaces.available ? loweringWarnings(policy, namespaces) : gaps) {
        warnings.push({
          agent: agent.id,
          warning: gaps.has(warning)
            ? `${warning} (${agent.file_access.best_effort ? 'accepted: best_effort is on' : 'runs are refused unless file_access.best_effort: true'})`
            : warning,
        })
      }
    }
  } finally {
    removeTempDir(tmpDir)
  }
  return warnings
}

/**
 * Compiling writes nothing there: rmdir, and the recursive removal (a module of its own to load)
 * only if something did.
 */
function removeTempDir(dir: string): void {
  try {
    fs.rmdirSync(dir)
  } catch {
    fs.rmSync(dir, {recursive: true, force: true})
  }
}
