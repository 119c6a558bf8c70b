import {Flags} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {sandboxExplain, type SandboxExplanation} from '../../runtime/host-sandbox/exec.js'

export default class SandboxExplain extends BaseCommand<typeof SandboxExplain> {
  static summary = "print what an agent's host sandbox enforces, rule by rule, and by which kernel mechanism"
  static flags = {
    agent: Flags.string({char: 'a', description: 'agent id', required: true}),
  }
  static examples = [
    '<%= config.bin %> sandbox explain --agent meepa',
    '<%= config.bin %> sandbox explain --agent meepa --json',
  ]

  async run(): Promise<SandboxExplanation> {
    const explanation = await sandboxExplain(this.loadConfig(), this.flags.agent)
    const {report, seatbelt} = explanation
    const {green, red, yellow, bold} = await this.colours()
    this.log(`agent ${explanation.agent}, workspace ${explanation.workspace}`)
    this.log('resource limits (limits section):')
    for (const limit of explanation.limits)
      this.log(
        `  ${limit.limit} ${limit.value}: ${limit.enforced ? green(limit.measured ? 'enforced by measurement, not by the kernel' : 'enforced') : red('NOT ENFORCED')}\n      ${limit.how}`,
      )
    this.log('')
    if (seatbelt) {
      this.log('macOS Seatbelt profile (sandbox-exec -p PROFILE with these -D parameters):')
      for (const [name, value] of Object.entries(seatbelt.params)) this.log(`  -D ${name}=${value}`)
      this.log(seatbelt.profile)
      return explanation
    }
    if (!report) return explanation
    const kernel = report.kernel
    this.log(
      `kernel: Landlock ABI ${kernel.landlock_abi}${kernel.landlock_unavailable ? ` (unavailable: ${kernel.landlock_unavailable})` : ''}, seccomp ${kernel.seccomp ? 'available' : red('UNAVAILABLE')}, ${kernel.arch}`,
    )
    this.log(
      report.namespaces.available
        ? `namespaces: user, mount, PID, IPC via ${report.namespaces.tool} (private /proc and /dev/pts, denied paths covered)`
        : `namespaces: ${red('UNAVAILABLE')} (${report.namespaces.unavailable}): host processes are visible, no pseudo-terminals, a deny inside a writable tree costs its parents their create rights`,
    )
    this.log(
      `status: ${report.enforced ? green('fully enforced') : `${report.best_effort ? yellow('BEST EFFORT, these are NOT enforced') : red('REFUSED, runs fail until fixed')}:`}`,
    )
    for (const gap of report.gaps) this.log(`  - ${report.best_effort ? yellow(gap) : red(gap)}`)
    if (report.namespaces.covered.length > 0) {
      this.log('')
      this.log('covered inside the sandbox (their parents keep full rights):')
      for (const cover of report.namespaces.covered) this.log(`  ${cover.path}  [${cover.mechanism}; ${cover.reason}]`)
    }
    this.log('')
    this.log(`${bold.green('allowed')} (Landlock path rules; a rule covers everything beneath it):`)
    for (const rule of report.rules) this.log(`  ${green(rule.path)}\n      ${rule.rights.join(',')}  [${rule.reason}]`)
    this.log('')
    this.log(`${bold.red('denied')} (nothing else is reachable either: Landlock denies by default):`)
    for (const deny of report.denies)
      this.log(
        `  ${red(deny.path)}${deny.exists ? '' : ' (missing)'}  [${deny.source}: ${deny.reason}]\n      ${deny.mechanism}`,
      )
    this.log('')
    this.log(`network: ${report.network.mode}`)
    for (const mechanism of report.network.enforced_by) this.log(`  - ${mechanism}`)
    this.log('')
    this.log('process:')
    for (const entry of report.process) this.log(`  - ${entry.what}: ${entry.mechanism}`)
    this.log('')
    this.log('known limits:')
    for (const limit of report.limits) this.log(`  - ${limit}`)
    if (report.notes.length > 0) {
      this.log('')
      this.log('notes on the config:')
      for (const note of report.notes) this.log(`  - ${note}`)
    }
    return explanation
  }
}
