import {describe, expect, it} from 'vitest'
import {
  dockerTag,
  generateContainerDockerfile,
  generateIsolationDockerfile,
  isolationImageTag,
} from '../../../src/sandbox/docker/dockerfile.js'

const spec = {
  baseImage: 'debian:bookworm-slim',
  packages: ['python3', 'git'],
  envVars: {LANG: 'C.UTF-8'},
  packageManager: 'apt' as const,
}

describe('container image Dockerfile (pure, previewable)', () => {
  it('installs the packages with apt-get on a Debian base, sorted, and sets env_vars', () => {
    const {dockerfile, tag} = generateContainerDockerfile(spec)
    expect(dockerfile).toContain('FROM debian:bookworm-slim\n')
    expect(dockerfile).toContain('apt-get install -y --no-install-recommends git python3')
    expect(dockerfile).toContain('ENV LANG="C.UTF-8"')
    expect(tag).toMatch(/^meepa-sandbox:[0-9a-f]{16}$/)
  })

  it('uses apk add on an Alpine base', () => {
    const {dockerfile} = generateContainerDockerfile({...spec, baseImage: 'alpine:3.20', packageManager: 'apk'})
    expect(dockerfile).toContain('RUN apk add --no-cache git python3')
    expect(dockerfile).not.toContain('apt-get')
  })

  it('gives the same tag for the same content and a new tag when the package list changes', () => {
    const first = generateContainerDockerfile(spec)
    expect(generateContainerDockerfile({...spec, packages: ['git', 'python3', 'git']}).tag).toBe(first.tag)
    expect(generateContainerDockerfile({...spec, packages: ['git', 'python3', 'jq']}).tag).not.toBe(first.tag)
    expect(generateContainerDockerfile({...spec, envVars: {LANG: 'C'}}).tag).not.toBe(first.tag)
    expect(generateContainerDockerfile({...spec, baseImage: 'debian:trixie-slim'}).tag).not.toBe(first.tag)
  })

  it('needs no package manager when there are no packages', () => {
    const {dockerfile} = generateContainerDockerfile({baseImage: 'scratch-like:1', packages: [], envVars: {}})
    expect(dockerfile).not.toContain('RUN')
  })

  it('refuses packages on a base with neither apt-get nor apk, saying what to do', () => {
    expect(() => generateContainerDockerfile({...spec, packageManager: null})).toThrow(
      expect.objectContaining({code: 'E_IMAGE', message: expect.stringContaining('neither apt-get')}),
    )
  })

  it('refuses a package name a shell would interpret, naming the entry', () => {
    expect(() => generateContainerDockerfile({...spec, packages: ['git', 'curl; rm -rf /']})).toThrow(
      expect.objectContaining({code: 'E_CONFIG', message: expect.stringContaining('image_config.packages[1]')}),
    )
  })

  it('keeps env values literal: quotes, backslashes and $ cannot break out or expand', () => {
    const {dockerfile} = generateContainerDockerfile({...spec, envVars: {X: 'a "b" \\ $HOME'}})
    expect(dockerfile).toContain('ENV X="a \\"b\\" \\\\ \\$HOME"')
    expect(() => generateContainerDockerfile({...spec, envVars: {X: 'two\nlines'}})).toThrow(/line break/)
    expect(() => generateContainerDockerfile({...spec, envVars: {'1X': 'v'}})).toThrow(/not a valid variable name/)
  })

  it('refuses a base image that is not an image reference', () => {
    expect(() => generateContainerDockerfile({...spec, baseImage: 'debian\nRUN evil'})).toThrow(
      expect.objectContaining({code: 'E_CONFIG'}),
    )
  })
})

describe('isolation image', () => {
  it('adds Node and the app to the base and labels the base ID and app hash', () => {
    const text = generateIsolationDockerfile({
      baseRef: 'meepa-sandbox:abc',
      baseId: 'sha256:1',
      basePath: '/opt/conda/bin:/usr/bin',
      appHash: 'h1',
      version: '0.1.0',
    })
    expect(text).toContain('FROM meepa-sandbox:abc\n')
    expect(text).toContain('COPY node/node /opt/meepagateway/bin/node')
    expect(text).toContain('ENV PATH="/opt/conda/bin:/usr/bin:/opt/meepagateway/bin"')
    expect(text).toContain('meepagateway.base-id="sha256:1"')
    expect(text).toContain('meepagateway.app-hash="h1"')
  })

  it('is tagged meepagateway-isolated:<version>-<base-tag>, always a valid Docker tag', () => {
    expect(isolationImageTag('0.1.0', 'meepa-sandbox:0123abcd')).toBe(
      'meepagateway-isolated:0.1.0-meepa-sandbox-0123abcd',
    )
    expect(isolationImageTag('0.1.0', 'debian:bookworm-slim')).toBe('meepagateway-isolated:0.1.0-debian-bookworm-slim')
    const long = isolationImageTag(
      '0.1.0',
      `registry.example.com:5000/team/${'x'.repeat(200)}@sha256:${'f'.repeat(64)}`,
    )
    expect(long.split(':')[1]).toMatch(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/)
    expect(dockerTag('.-weird//name')).toBe('weird-name')
    expect(dockerTag(`a${'b'.repeat(200)}1`)).not.toBe(dockerTag(`a${'b'.repeat(200)}2`))
  })
})
