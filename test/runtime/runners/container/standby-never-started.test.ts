import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {shellScripted} from '../../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../../helpers/home.js'
import {startServe, type ServeProcess} from '../../../helpers/serve.js'
import {describeWithDocker, realDockerPath, runningStandby, tempDir} from '../../../helpers/docker-env.js'
import {homeLabel} from '../../../../src/sandbox/docker/home-label.js'

/*
 * A standby the engine never made: it was started before the message, and its container's
 * creation failed only once the message was handed to it (Podman does this when the volume it was
 * to mount is removed meanwhile). Nothing of the message ran, so the message gets a fresh
 * container, once, and runs exactly once. The fault is injected in the docker client (a wrapper
 * that, armed, answers the next standby's `docker run` as that engine did); everything else runs
 * on the real engine.
 */

const ENGINE_REFUSAL =
  'Error response from daemon: container create: no volume with name meepa-ws-x found in database: no such volume'

describeWithDocker('a standby whose container was never made (real engine)', () => {
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  const wrapperDir = tempDir('meepa-standby-fault-')
  const armed = path.join(wrapperDir, 'fail-next-standby')

  beforeAll(async () => {
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    const bin = path.join(wrapperDir, 'docker')
    fs.writeFileSync(
      bin,
      [
        '#!/bin/sh',
        `if [ "$1" = run ] && [ -e '${armed}' ] && case " $* " in *meepagateway.run=standby*) true;; *) false;; esac; then`,
        `  rm -f '${armed}'`,
        // the engine answers only once the message came: the client has it, nothing was created
        '  head -c 1 > /dev/null',
        `  echo 'docker: ${ENGINE_REFUSAL}' >&2`,
        '  exit 125',
        'fi',
        `exec '${realDockerPath()}' "$@"`,
        '',
      ].join('\n'),
      {mode: 0o755},
    )
    const port = await freePort()
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'warm', container_mode: {enabled: true, network: 'host'}}], {
        captain: {enabled: true, bind: '127.0.0.1', port},
      }),
    )
    serve = await startServe({home: home.home, port, env: {MEEPAGATEWAY_DOCKER_BIN: bin}})
  }, 120_000)

  afterAll(async () => {
    await serve?.stop()
    await llm.close()
    home.cleanup()
    fs.rmSync(wrapperDir, {recursive: true, force: true})
  })

  it('the message runs once, in a fresh container, and the next standby is a real one', async () => {
    const count = 'echo ran >> ran.log && printf "runs=%s" "$(wc -l < ran.log)"'
    fs.writeFileSync(armed, '')
    // the first message is cold; the standby started after it is the one that will fail
    expect((await serve!.chat('warm', `RUN: ${count}`)).reply, serve!.output().slice(-3000)).toContain('runs=1')
    for (let i = 0; i < 100 && fs.existsSync(armed); i++) await new Promise((resolve) => setTimeout(resolve, 100))
    expect(fs.existsSync(armed)).toBe(false)

    const second = await serve!.chat('warm', `RUN: ${count}`)
    expect(second.status).toBe(200)
    // once: not twice (runs=3), not refused
    expect(second.reply, serve!.output().slice(-3000)).toContain('runs=2')
    expect(serve!.output()).toMatch(
      /standby container meepa-standby_\w+ never started: docker run failed before the container started \(exit 125\): docker: Error response from daemon: container create: no volume.*; starting a fresh container for this message/,
    )
    // the standby after it is made by the engine, and serves the third message
    expect(await runningStandby(home.home)).not.toBe('')
    const third = await serve!.chat('warm', `RUN: ${count}`)
    expect(third.reply).toContain('runs=3')
    expect(serve!.output().match(/running in standby container/g)?.length).toBe(2)
  }, 180_000)

  it('leaves no container behind when the gateway stops', async () => {
    await serve!.stop()
    serve = undefined
    const {stdout} = await execa('docker', ['ps', '-aq', '--filter', `label=meepagateway.home=${homeLabel(home.home)}`])
    expect(stdout.trim()).toBe('')
  }, 60_000)
})
