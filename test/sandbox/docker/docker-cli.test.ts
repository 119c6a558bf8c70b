import fs from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {credentialFreeConfig, DockerCli} from '../../../src/sandbox/docker/cli.js'
import {parseElfRuntime, readElfRuntime} from '../../../src/sandbox/docker/elf.js'
import {realDockerPath, tempDir} from '../../helpers/docker-env.js'

const hasDockerCli = fs.existsSync(realDockerPath())

describe('docker CLI layer: every failure of the engine is a clear error with the fix', () => {
  it('a docker CLI that is not on PATH gives E_DOCKER_MISSING', async () => {
    const cli = new DockerCli({baseEnv: {PATH: '/nonexistent-bin'}})
    const error = await cli.ping().catch((caught: unknown) => caught)
    expect(error).toMatchObject({
      code: 'E_DOCKER_MISSING',
      exitCode: 10,
      message: expect.stringContaining('not found on PATH'),
    })
    expect((error as {suggestions: string[]}).suggestions.join(' ')).toMatch(/install Docker/)
  })

  it('a configured docker binary that does not exist names the setting', async () => {
    const cli = new DockerCli({baseEnv: {PATH: process.env.PATH, MEEPAGATEWAY_DOCKER_BIN: '/opt/nowhere/docker'}})
    await expect(cli.ping()).rejects.toMatchObject({
      code: 'E_DOCKER_MISSING',
      message: expect.stringContaining('MEEPAGATEWAY_DOCKER_BIN=/opt/nowhere/docker'),
    })
  })

  describe.skipIf(!hasDockerCli)('with the docker CLI installed', () => {
    let dir: string
    let hungServer: net.Server
    let hungSocket: string
    const held: net.Socket[] = []

    beforeAll(async () => {
      dir = tempDir('meepa-docker-cli-')
      // An engine that accepts the connection and never answers: what a wedged dockerd looks like.
      hungSocket = path.join(dir, 'hung.sock')
      hungServer = net.createServer((socket) => held.push(socket))
      await new Promise<void>((resolve) => hungServer.listen(hungSocket, resolve))
    })
    afterAll(async () => {
      for (const socket of held) socket.destroy()
      await new Promise((resolve) => hungServer.close(resolve))
      fs.rmSync(dir, {recursive: true, force: true})
    })

    it('an engine that is not running gives E_DOCKER_DOWN, naming DOCKER_HOST and how to start it', async () => {
      const cli = new DockerCli({baseEnv: {PATH: process.env.PATH, DOCKER_HOST: `unix://${dir}/absent.sock`}})
      const error = await cli.ping().catch((caught: unknown) => caught)
      expect(error).toMatchObject({
        code: 'E_DOCKER_DOWN',
        retryable: true,
        message: expect.stringContaining('absent.sock'),
      })
      expect((error as {suggestions: string[]}).suggestions.join(' ')).toMatch(/systemctl start docker/)
    })

    it('an engine that accepts and never answers gives E_DOCKER_HUNG at the deadline instead of hanging', async () => {
      const cli = new DockerCli({baseEnv: {PATH: process.env.PATH, DOCKER_HOST: `unix://${hungSocket}`}})
      const started = Date.now()
      const error = await cli.exec(['ps'], {timeoutMs: 1500}).catch((caught: unknown) => caught)
      expect(Date.now() - started).toBeLessThan(6000)
      expect(error).toMatchObject({code: 'E_DOCKER_HUNG', message: expect.stringContaining('did not answer')})
      expect((error as {suggestions: string[]}).suggestions.join(' ')).toMatch(/restart/)
      expect(held.length).toBeGreaterThan(0) // the CLI really reached the hung socket
    })

    it('an AbortSignal stops a call to a hung engine at once', async () => {
      const cli = new DockerCli({baseEnv: {PATH: process.env.PATH, DOCKER_HOST: `unix://${hungSocket}`}})
      const controller = new AbortController()
      const started = Date.now()
      setTimeout(() => controller.abort(), 200)
      await expect(cli.exec(['info'], {signal: controller.signal, timeoutMs: 60_000})).rejects.toMatchObject({
        code: 'E_DOCKER',
      })
      expect(Date.now() - started).toBeLessThan(5000)
    })

    it('an engine that refuses the attach as Podman does (its OCI runtime failed) says what that means', async () => {
      // Podman's Docker-compatible API, when its runtime cannot create the container: the create
      // succeeds, the attach that `docker run -i` makes before starting it answers 409
      const socket = path.join(dir, 'refusing.sock')
      const asked: string[] = []
      const server = http.createServer((request, response) => {
        asked.push(`${request.method} ${request.url?.replace(/^\/v[\d.]+/, '').split('?')[0]}`)
        response.setHeader('Api-Version', '1.41')
        response.setHeader('Content-Type', 'application/json')
        if (request.url?.endsWith('/_ping')) return response.end('OK')
        if (request.url?.includes('/containers/create')) {
          response.statusCode = 201
          return response.end(JSON.stringify({Id: 'c0ffee', Warnings: []}))
        }
        if (request.url?.includes('/attach')) {
          response.statusCode = 409
          return response.end(
            JSON.stringify({cause: 'OCI runtime error', message: 'preparing container for attach', response: 409}),
          )
        }
        response.statusCode = 404
        response.end(JSON.stringify({message: 'no such route'}))
      })
      await new Promise<void>((resolve) => server.listen(socket, resolve))
      try {
        const cli = new DockerCli({baseEnv: {PATH: process.env.PATH, DOCKER_HOST: `unix://${socket}`}})
        const error = await cli
          .check(['run', '-i', '--rm', '--network', 'none', 'debian:bookworm-slim', 'true'], {timeoutMs: 20_000})
          .catch((caught: unknown) => caught)
        expect(asked).toContain('POST /containers/c0ffee/attach')
        expect(asked).not.toContain('POST /containers/c0ffee/start') // so nothing ran
        expect(error).toMatchObject({code: 'E_DOCKER', message: expect.stringContaining('received 409')})
        expect((error as Error).message).toMatch(/could not create the container.*OCI runtime.*runtime = "runc"/)
      } finally {
        await new Promise((resolve) => server.close(resolve))
      }
    })

    it("a listed engine's CLI still finds the operator's own plugins (buildx installed per user)", async () => {
      const operator = tempDir('meepa-operator-docker-')
      const home = tempDir('meepa-plugin-home-')
      try {
        const plugins = path.join(operator, 'cli-plugins')
        fs.mkdirSync(plugins)
        // a CLI plugin as docker finds them: it answers the metadata question, then runs
        fs.writeFileSync(
          path.join(plugins, 'docker-meepatest'),
          `#!/bin/sh\nif [ "$1" = docker-cli-plugin-metadata ]; then echo '{"SchemaVersion":"0.1.0","Vendor":"test","Version":"v1"}'; exit 0; fi\necho "the operator's plugin ran"\n`,
          {mode: 0o755},
        )
        fs.writeFileSync(path.join(operator, 'config.json'), JSON.stringify({auths: {'r.example': {auth: 'c2VjcmV0'}}}))
        const baseEnv = {PATH: process.env.PATH, HOME: home, DOCKER_CONFIG: operator, MEEPAGATEWAY_HOME: home}
        const listed = new DockerCli({baseEnv, engineArgs: ['--host', `unix://${dir}/absent.sock`]})
        const ran = await listed.exec(['meepatest'], {timeoutMs: 20_000})
        expect(ran.stdout + ran.stderr).toContain("the operator's plugin ran")
        expect(listed.env().DOCKER_CONFIG).not.toBe(operator)
      } finally {
        fs.rmSync(operator, {recursive: true, force: true})
        fs.rmSync(home, {recursive: true, force: true})
      }
    })

    it('the docker CLI gets no variable of the operator beyond the ones docker reads', () => {
      const cli = new DockerCli({
        baseEnv: {PATH: '/usr/bin', HOME: '/root', DOCKER_HOST: 'unix:///x.sock', OPENAI_API_KEY: 'sk-secret'},
      })
      expect(cli.env()).toEqual({PATH: '/usr/bin', HOME: '/root', DOCKER_HOST: 'unix:///x.sock'})
    })
  })

  it("an engine named by flags gets the gateway's credential-free config, made again when changed; the local one the operator's", () => {
    const home = tempDir('meepa-docker-config-')
    try {
      const baseEnv = {PATH: '/usr/bin', HOME: '/root', DOCKER_CONFIG: '/root/.docker', MEEPAGATEWAY_HOME: home}
      const listed = new DockerCli({baseEnv, engineArgs: ['--host', 'tcp://engine.example:2376']})
      const dir = path.join(home, 'cache', 'docker-config')
      expect(listed.env().DOCKER_CONFIG).toBe(dir)
      const file = path.join(dir, 'config.json')
      expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual({
        auths: {'meepagateway.invalid': {}},
        cliPluginsExtraDirs: ['/root/.docker/cli-plugins'],
      })
      fs.writeFileSync(file, JSON.stringify({credsStore: 'desktop'}))
      fs.chmodSync(dir, 0o755)
      listed.env()
      expect(fs.readFileSync(file, 'utf8')).toBe(credentialFreeConfig(baseEnv))
      expect(fs.statSync(dir).mode & 0o777).toBe(0o700)
      expect(new DockerCli({baseEnv}).env().DOCKER_CONFIG).toBe('/root/.docker')
    } finally {
      fs.rmSync(home, {recursive: true, force: true})
    }
  })
})

describe('runtime compatibility facts from the Node binary', () => {
  it("reads this Node's architecture and C library from its ELF header", async () => {
    const runtime = await readElfRuntime(process.execPath)
    expect(runtime?.arch).toBe(process.arch === 'x64' ? 'amd64' : process.arch)
    expect(['glibc', 'musl', 'static']).toContain(runtime?.libc)
  })

  it('tells a musl executable from a glibc one, and a non-ELF (macOS) file from both', () => {
    const elf = (interp: string) => {
      const head = Buffer.alloc(512)
      head.writeUInt32BE(0x7f454c46, 0)
      head[4] = 2 // 64-bit
      head[5] = 1 // little-endian
      head.writeUInt16LE(0xb7, 18) // aarch64
      head.writeBigUInt64LE(64n, 0x20) // program headers right after the header
      head.writeUInt16LE(56, 0x36)
      head.writeUInt16LE(1, 0x38)
      head.writeUInt32LE(3, 64) // PT_INTERP
      head.writeBigUInt64LE(200n, 64 + 8)
      head.writeBigUInt64LE(BigInt(interp.length + 1), 64 + 0x20)
      head.write(interp, 200, 'latin1')
      return head
    }
    expect(parseElfRuntime(elf('/lib/ld-musl-aarch64.so.1'))).toEqual({
      arch: 'arm64',
      interpreter: '/lib/ld-musl-aarch64.so.1',
      libc: 'musl',
    })
    expect(parseElfRuntime(elf('/lib/ld-linux-aarch64.so.1'))?.libc).toBe('glibc')
    expect(parseElfRuntime(Buffer.from('cffaedfe0c000001', 'hex'))).toBeNull()
  })
})
