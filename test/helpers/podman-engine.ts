import {execa} from 'execa'
import {describeRequiring} from './describe-requiring.js'
import {BASE_IMAGE, dockerMissingReason} from './docker-env.js'

/**
 * The rootless Podman engine scripts/ci/podman-up.sh starts: a non-root user's `podman system
 * service` on a socket root can reach. Without it the suites skip with the reason, or fail when
 * MEEPA_REQUIRE_PODMAN=1 (as CI sets).
 */
export const PODMAN_SOCKET = process.env.MEEPA_PODMAN_SOCKET || '/run/meepa-podman/podman.sock'
export const PODMAN_HOST = `unix://${PODMAN_SOCKET}`

/** The docker CLI against the Podman engine. */
export function podmanDocker(args: string[], input?: string) {
  return execa('docker', ['--host', PODMAN_HOST, ...args], {reject: false, timeout: 120_000, input})
}

async function probe(): Promise<string | undefined> {
  const version = await podmanDocker(['version', '--format', '{{.Server.Version}}'])
  if (version.exitCode !== 0)
    return `no Podman engine answers on ${PODMAN_HOST} (${String(version.stderr || version.shortMessage).split('\n')[0]})`
  const info = await podmanDocker(['info', '--format', '{{.DockerRootDir}}'])
  if (!/containers\/storage/.test(info.stdout)) return `${PODMAN_HOST} is not a Podman engine`
  return dockerMissingReason && `the base image comes from the local Docker engine: ${dockerMissingReason}`
}

const podmanMissingReason = await probe()

export function describeWithPodman(name: string, body: () => void): void {
  const missingReason =
    podmanMissingReason && `${podmanMissingReason}; run scripts/ci/podman-up.sh as root to start rootless Podman`
  describeRequiring({what: 'Podman', missingReason, requireEnv: 'MEEPA_REQUIRE_PODMAN'}, name, body)
}

/**
 * Puts the base image into the Podman user's storage from the local Docker engine, when missing.
 * `docker export | import` of its filesystem rather than `save | load`: a debootstrap-made base
 * carries a 0700 `./` in its layer, which Docker ignores but Podman applies (no user could start).
 */
export async function ensurePodmanBaseImage(): Promise<void> {
  if ((await podmanDocker(['image', 'inspect', BASE_IMAGE])).exitCode === 0) return
  const created = await execa('docker', ['create', '--network', 'none', BASE_IMAGE, 'true'])
  const id = created.stdout.trim()
  try {
    await execa(
      'sh',
      [
        '-c',
        `docker export "$1" | docker --host "$2" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'CMD ["bash"]' - "$3"`,
        'sh',
        id,
        PODMAN_HOST,
        BASE_IMAGE,
      ],
      {timeout: 300_000},
    )
  } finally {
    await execa('docker', ['rm', id], {reject: false})
  }
}
