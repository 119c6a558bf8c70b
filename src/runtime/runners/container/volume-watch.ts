import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {LABEL} from '../../../sandbox/docker/dockerfile.js'
import {CONTAINER_WORKSPACE} from '../../../sandbox/docker/run-args.js'
import {ownContainerArgs} from '../../container/own-container.js'
import type {DiskUsage, DiskWatch} from '../../run-lifecycle/disk-limit.js'
import {randomHex} from '../../util/random.js'

/** How often the engine-side measure reads the volume. */
const EVERY_SECONDS = 2

/**
 * limits.disk measured on the engine itself, where neither a disk image (engine-disk.ts) nor this
 * machine's view of the volume (a local Podman's) holds it: a Podman engine elsewhere, a Docker
 * engine run with best_effort. A short container of the gateway's own, beside the run, reads the
 * volume with `du` every 2 s (any depth, a hard-linked file once, allocated blocks), as root with
 * CAP_DAC_READ_SEARCH only (an agent's unreadable folder is still read), the volume mounted
 * read-only; what it cannot read counts as over. The run is stopped once it is over (`onOver`).
 */
export function watchVolumeOnEngine(
  cli: DockerCli,
  options: {volume: string; image: string; labels: Record<string, string>; limitBytes: number},
  onOver: (usage: DiskUsage) => void,
): DiskWatch {
  const name = `meepa-measure-${randomHex(8)}`
  // du's total as a number; any error but a file that vanished while it walked as `error …`
  const script = [
    "tab=$(printf '\\t')",
    'while :; do',
    `  du -s -x -B1 ${CONTAINER_WORKSPACE} 2>&1 | while IFS= read -r line; do`,
    '    case "$line" in',
    '      *"No such file or directory") ;;',
    '      [0-9]*"$tab"*) echo "${line%%"$tab"*}" ;;',
    '      *) echo "error $line" ;;',
    '    esac',
    '  done',
    `  sleep ${EVERY_SECONDS}`,
    'done',
  ].join('\n')
  const child = cli.spawn(
    [
      ...ownContainerArgs({
        image: options.image,
        user: '0:0',
        labels: {...options.labels, [LABEL.run]: 'disk-measure'},
        caps: ['DAC_READ_SEARCH'],
        volumes: [`${options.volume}:${CONTAINER_WORKSPACE}:ro`],
        extra: ['--name', name],
      }),
      '-c',
      script,
    ],
    {streamStdout: true, timeoutMs: 24 * 3600_000, removeIfOwnerDies: name},
  )
  let last: DiskUsage = {bytes: 0}
  let reported = false
  let buffered = ''
  child.stdout?.on('data', (chunk: Buffer) => {
    buffered += chunk.toString('utf8')
    const lines = buffered.split('\n')
    buffered = lines.pop() ?? ''
    for (const line of lines) {
      last = /^\d+$/.test(line)
        ? {bytes: Number(line)}
        : {bytes: last.bytes, error: line.replace(/^error /, '') || 'du failed'}
      if ((last.error !== undefined || last.bytes > options.limitBytes) && !reported) {
        reported = true
        onOver(last)
      }
    }
  })
  let final: Promise<{usage: DiskUsage; over: boolean}> | undefined
  return {
    stop() {
      // the last reading (at most 2 s old): what the run wrote after it is bounded by what comes back
      final ??= Promise.resolve({usage: last, over: last.error !== undefined || last.bytes > options.limitBytes})
      // removed behind the reply; its keeper removes it if this process dies first
      void cli
        .exec(['rm', '--force', name], {timeoutMs: 30_000})
        .catch(() => {})
        .finally(() => child.kill('SIGKILL'))
      return final
    },
  }
}
