import {Flags} from '@oclif/core'
import {BaseCommand} from './base-command.js'
import {gatewayHome} from '../runtime/util/paths.js'
import {listRuns, type RunFile, type RunRecordWithFiles} from '../runtime/state/run-records.js'

export default class Runs extends BaseCommand<typeof Runs> {
  static summary =
    'list run records (newest first): agent, connector, channel, isolation, outcome, reply delivery, duration, tokens, files'
  static flags = {
    agent: Flags.string({char: 'a', description: 'only runs of this agent'}),
    limit: Flags.integer({char: 'n', description: 'how many runs to show', default: 20, min: 1, max: 10_000}),
  }
  static examples = [
    '<%= config.bin %> runs',
    '<%= config.bin %> runs --agent meepa --limit 50',
    '<%= config.bin %> runs --json',
  ]

  async run(): Promise<RunRecordWithFiles[]> {
    const runs = listRuns({home: gatewayHome(), agentId: this.flags.agent, limit: this.flags.limit})
    if (runs.length === 0) {
      this.log(this.flags.agent ? `no runs recorded for agent ${this.flags.agent}` : 'no runs recorded yet')
      return runs
    }
    const rows = runs.map((run) => [
      new Date(run.started_at).toISOString().replace('T', ' ').slice(0, 19),
      run.id,
      run.agent_id,
      run.connector,
      run.channel_id,
      run.isolation,
      run.status,
      run.delivery ?? '-',
      run.duration_ms === null ? '-' : `${run.duration_ms} ms`,
      run.input_tokens === null ? '-' : `${run.input_tokens}/${run.output_tokens}`,
      filesSummary(run.files),
      [
        run.error_code ? `${run.error_code}: ${oneLine(run.error_message ?? '')}` : '',
        run.delivery_error ? `reply undeliverable: ${oneLine(run.delivery_error)}` : '',
      ]
        .filter(Boolean)
        .join('; '),
    ])
    const header = [
      'STARTED (UTC)',
      'RUN',
      'AGENT',
      'CONNECTOR',
      'CHANNEL',
      'ISOLATION',
      'STATUS',
      'REPLY',
      'DURATION',
      'TOKENS IN/OUT',
      'FILES',
      'ERROR',
    ]
    const widths = header.map((title, column) =>
      Math.max(title.length, ...rows.map((row) => (row[column] as string).length)),
    )
    const format = (row: string[]) =>
      row
        .map((cell, column) => (column === row.length - 1 ? cell : cell.padEnd(widths[column] as number)))
        .join('  ')
        .trimEnd()
    this.log(format(header))
    for (const [index, row] of rows.entries()) {
      this.log(format(row))
      // each file on its own line under its run: name, size, type, and why one was skipped
      for (const file of (runs[index] as RunRecordWithFiles).files) this.log(`    ${fileLine(file)}`)
    }
    return runs
  }
}

/** `2 in, 1 out (1 skipped)`; `-` without files. */
function filesSummary(files: RunFile[]): string {
  if (files.length === 0) return '-'
  const count = (direction: 'in' | 'out') => files.filter((file) => file.direction === direction).length
  const skipped = files.filter((file) => file.skipped_reason).length
  return [count('in') ? `${count('in')} in` : '', count('out') ? `${count('out')} out` : '']
    .filter(Boolean)
    .join(', ')
    .concat(skipped ? ` (${skipped} skipped)` : '')
}

/** `out report.pdf 12345 B application/pdf`, or why it was not sent (never its content: none is kept). */
function fileLine(file: RunFile): string {
  const what = [
    file.direction,
    JSON.stringify(file.name),
    file.size === null ? '' : `${file.size} B`,
    file.content_type ?? '',
  ]
  const line = what.filter(Boolean).join(' ')
  return file.skipped_reason
    ? `${line} - not ${file.direction === 'in' ? 'taken' : 'sent'}: ${oneLine(file.skipped_reason)}`
    : line
}

function oneLine(text: string): string {
  const first = text.split('\n')[0] ?? ''
  return first.length > 100 ? `${first.slice(0, 99)}…` : first
}
