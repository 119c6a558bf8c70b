import type {GatewayConfig, ImageConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import type {DockerCli} from '../../sandbox/docker/cli.js'
import {
  CONTAINER_IMAGE_REPO,
  ISOLATION_IMAGE_REPO,
  generateContainerDockerfile,
  type PackageManager,
} from '../../sandbox/docker/dockerfile.js'
import {detectPackageManager, inspectImage, type ImageContext} from '../../sandbox/docker/images.js'

export interface DockerfilePreview {
  dockerfile: string
  tag: string
  package_manager: PackageManager | null
  /** How the package manager was found: by looking inside the base image, or guessed from its name. */
  package_manager_source: 'image' | 'name' | 'not needed'
  note?: string
}

/**
 * The Dockerfile the image_config generates, exactly as `container build` would write it. The
 * package manager is read from the base image when Docker can tell (cached per image ID), and
 * guessed from its name otherwise, so the preview works without an engine.
 */
export async function previewDockerfile(imageConfig: ImageConfig, context: ImageContext): Promise<DockerfilePreview> {
  const spec = {baseImage: imageConfig.base_image, packages: imageConfig.packages, envVars: imageConfig.env_vars}
  if (spec.packages.length === 0) {
    return {...pick(generateContainerDockerfile(spec)), package_manager: null, package_manager_source: 'not needed'}
  }
  let manager: PackageManager | null
  let source: DockerfilePreview['package_manager_source'] = 'image'
  let note: string | undefined
  try {
    manager = await detectPackageManager(spec.baseImage, {...context, signal: AbortSignal.timeout(20_000)})
  } catch (error) {
    manager = /alpine/i.test(spec.baseImage) ? 'apk' : 'apt'
    source = 'name'
    note = `could not look inside ${spec.baseImage} (${(error as Error).message.split('\n')[0]}); guessed ${manager} from its name`
  }
  return {
    ...pick(generateContainerDockerfile({...spec, packageManager: manager})),
    package_manager: manager,
    package_manager_source: source,
    ...(note ? {note} : {}),
  }
}

function pick(generated: {dockerfile: string; tag: string}): {dockerfile: string; tag: string} {
  return {dockerfile: generated.dockerfile, tag: generated.tag}
}

/** image_config with a draft from the form laid over it (for previews of unsaved edits). */
export function withDraft(config: GatewayConfig, draft: unknown): ImageConfig {
  const base = config.image_config
  if (draft === undefined) return base
  if (!draft || typeof draft !== 'object' || Array.isArray(draft))
    throw new GatewayError('E_INPUT', 'draft must be a JSON object of image_config fields')
  const fields = draft as Partial<ImageConfig>
  return {
    ...base,
    ...(typeof fields.base_image === 'string' ? {base_image: fields.base_image.trim()} : {}),
    ...(Array.isArray(fields.packages) ? {packages: fields.packages.map(String)} : {}),
    ...(fields.env_vars && typeof fields.env_vars === 'object'
      ? {env_vars: Object.fromEntries(Object.entries(fields.env_vars).map(([k, v]) => [k, String(v)]))}
      : {}),
  }
}

/**
 * Removes one of the gateway's own images. Anything else is refused: the dashboard is not a
 * general Docker UI, and an operator's base images must survive a misclick.
 */
export async function deleteGatewayImage(
  cli: DockerCli,
  tag: string,
  signal?: AbortSignal,
): Promise<{deleted: string}> {
  const repository = tag.includes(':') ? tag.slice(0, tag.lastIndexOf(':')) : tag
  if (repository !== CONTAINER_IMAGE_REPO && repository !== ISOLATION_IMAGE_REPO) {
    throw new GatewayError(
      'E_USAGE',
      `${tag} is not an image the gateway built; the dashboard only deletes ${CONTAINER_IMAGE_REPO}:* and ${ISOLATION_IMAGE_REPO}:* images`,
      {
        suggestions: [`delete other images with docker image rm ${tag}`],
      },
    )
  }
  const info = await inspectImage(cli, tag, signal)
  if (!info) throw new GatewayError('E_NOT_FOUND', `no image ${tag} on this machine`)
  const result = await cli.exec(['image', 'rm', tag], {signal})
  if (result.exitCode !== 0) {
    if (/being used by|conflict/i.test(result.stderr)) {
      throw new GatewayError('E_BUSY', `${tag} is used by a container: ${result.stderr.trim().split('\n').at(-1)}`, {
        suggestions: ['wait for running agent messages to finish, or run meepagateway container clean'],
      })
    }
    throw new GatewayError('E_DOCKER', `docker image rm ${tag} failed: ${result.stderr.trim().split('\n').at(-1)}`)
  }
  return {deleted: tag}
}
