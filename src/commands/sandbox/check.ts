import {Flags} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {GatewayError} from '../../runtime/util/errors.js'
import {sandboxCheck, type SandboxCheckResult} from '../../runtime/host-sandbox/check.js'

export default class SandboxCheck extends BaseCommand<typeof SandboxCheck> {
  static summary = 'self-test the host sandbox: attempt each forbidden and each allowed operation under the policy'
  static description = 'Run it after a kernel upgrade. Exits non-zero when any probe fails.'
  static flags = {
    agent: Flags.string({char: 'a', description: 'agent id (default: every agent that uses the host sandbox)'}),
  }
  static examples = ['<%= config.bin %> sandbox check', '<%= config.bin %> sandbox check --agent meepa --json']

  async run(): Promise<SandboxCheckResult[]> {
    const results = await sandboxCheck(this.loadConfig(), this.flags.agent)
    let failed = 0
    for (const result of results) {
      this.log(`agent ${result.agent} (Landlock ABI ${result.landlock_abi}, network ${result.network}):`)
      for (const probe of result.probes) {
        if (!probe.pass) failed++
        const mark = probe.skipped ? 'skip' : probe.pass ? 'pass' : 'FAIL'
        this.log(
          `  ${mark.padEnd(4)}  ${probe.expect === 'denied' ? 'denied ' : 'allowed'}  ${probe.name}${probe.detail ? `  (${probe.detail})` : ''}`,
        )
      }
    }
    if (failed > 0) {
      if (this.jsonEnabled()) process.exitCode = 9
      else
        throw new GatewayError('E_SANDBOX', `${failed} sandbox probe${failed === 1 ? '' : 's'} failed`, {
          suggestions: ['run `meepagateway sandbox explain --agent ID` to see what the kernel enforces'],
        })
    }
    return results
  }
}
