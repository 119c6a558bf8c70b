import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {SSH_WRAPPER, sshArgsOf, sshEnvOf} from '../../../src/runtime/container/engine-ssh.js'

/*
 * The ssh wrapper the docker CLI (and the gateway's Podman client) runs, with a stand-in for the
 * real client that prints the argv it was given: host keys always checked, and on a Podman engine
 * the far command docker's dial-stdio becomes Podman's, and nothing else changes.
 */
describe('the ssh wrapper', () => {
  let dir: string
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-ssh-wrapper-'))
    fs.writeFileSync(path.join(dir, 'ssh'), '#!/bin/sh\nfor arg do printf "%s\\n" "$arg"; done\n', {mode: 0o755})
  })
  afterAll(() => fs.rmSync(dir, {recursive: true, force: true}))

  const argvOf = async (kind: 'docker' | 'podman', args: string[]) => {
    const env = {...sshEnvOf({kind, ssh: {known_hosts: '/k', identity: '/i'}}, `${dir}:/usr/bin:/bin`), HOME: dir}
    const ran = await execa(SSH_WRAPPER, args, {env, extendEnv: false})
    return ran.stdout.split('\n')
  }

  it("asks a Podman engine's far side for podman's dial-stdio, a Docker engine's for docker's", async () => {
    const args = sshArgsOf('ssh://deploy@build.example:2222', ['docker', 'system', 'dial-stdio'])
    expect(args).toEqual(['-l', 'deploy', '-p', '2222', '--', 'build.example', 'docker', 'system', 'dial-stdio'])
    const podman = await argvOf('podman', args)
    expect(podman.slice(-5)).toEqual(['--', 'build.example', 'podman', 'system', 'dial-stdio'])
    expect((await argvOf('docker', args)).slice(-3)).toEqual(['docker', 'system', 'dial-stdio'])
    // host keys checked, never asked about, whatever the engine
    expect(podman).toEqual(expect.arrayContaining(['StrictHostKeyChecking=yes', 'BatchMode=yes', '/i']))
  })

  it.runIf(fs.existsSync('/usr/bin/ssh'))(
    "lends the engine's host nothing of the operator's, whatever ~/.ssh/config says for every host",
    async () => {
      // the real client's effective options for the engine's connection (-G: computed, not connected)
      const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-ssh-home-'))
      try {
        fs.mkdirSync(path.join(home, '.ssh'), {mode: 0o700})
        fs.writeFileSync(
          path.join(home, '.ssh', 'config'),
          'Host *\n  ForwardAgent yes\n  ForwardX11 yes\n  PermitLocalCommand yes\n  LocalCommand touch /tmp/meepa-pwned\n  LocalForward 15432 127.0.0.1:5432\n  RemoteForward 2222 127.0.0.1:22\n',
          {mode: 0o600},
        )
        const env = {
          ...sshEnvOf({kind: 'docker', ssh: {known_hosts: '/k', identity: '/i'}}, '/usr/bin:/bin'),
          HOME: home,
        }
        const args = ['-G', ...sshArgsOf('ssh://deploy@far.example', ['docker', 'system', 'dial-stdio'])]
        const options = (await execa(SSH_WRAPPER, args, {env, extendEnv: false})).stdout.split('\n')
        expect(options).toEqual(
          expect.arrayContaining([
            'forwardagent no',
            'forwardx11 no',
            'permitlocalcommand no',
            'clearallforwardings yes',
          ]),
        )
        expect(options.filter((line) => /^(localforward|remoteforward) /.test(line))).toEqual([])
      } finally {
        fs.rmSync(home, {recursive: true, force: true})
      }
    },
  )

  it('changes nothing but that command: a host named docker, other far commands', async () => {
    const named = await argvOf('podman', ['-l', 'u', '--', 'docker', 'docker', 'system', 'dial-stdio'])
    expect(named.slice(-4)).toEqual(['docker', 'podman', 'system', 'dial-stdio'])
    const other = await argvOf('podman', ['-l', 'u', '--', 'h', 'docker', 'system', 'info'])
    expect(other.slice(-3)).toEqual(['docker', 'system', 'info'])
    const spaced = await argvOf('podman', ['--', 'h', 'a b', 'docker system dial-stdio'])
    expect(spaced.slice(-2)).toEqual(['a b', 'docker system dial-stdio'])
  })
})
