import {BaseCommand, engineFlag} from '../base-command.js'
import {listGatewayImages, type GatewayImage} from '../../runtime/container/status.js'
import type {EngineFailure} from '../../runtime/container/per-engine.js'
import {engineAnswered, engineTargets} from '../../cli/engine-targets.js'
import {escapeControls as shown} from '../../runtime/util/escape-controls.js'

export default class ContainerImages extends BaseCommand<typeof ContainerImages> {
  static summary = 'list every meepagateway image with its tag, size, age and whether it is in use'
  static description = 'With an `engines:` list, the images of each engine (or of the one --engine names).'
  static flags = {
    engine: engineFlag,
  }
  static examples = [
    '<%= config.bin %> container images',
    '<%= config.bin %> container images --json',
    '<%= config.bin %> container images --engine remote',
  ]

  async run(): Promise<GatewayImage[] | {engines: Array<{name: string; images: GatewayImage[]} | EngineFailure>}> {
    const loaded = this.loadConfig()
    const targets = await engineTargets(loaded, this.flags.engine)
    if (!targets) {
      const images = await listGatewayImages(loaded)
      this.print(images, '')
      return images
    }
    const result = await (await import('../../runtime/container/per-engine.js')).imagesOnEngines(loaded, targets)
    for (const listed of result.engines)
      if (engineAnswered((line) => this.log(line), listed) && 'images' in listed) this.print(listed.images, '  ')
    return result
  }

  private print(images: GatewayImage[], indent: string): void {
    for (const image of images) {
      const use = image.in_use
        ? `in use${image.used_by.length > 0 ? ` by ${shown(image.used_by.join(', '))}` : ''}`
        : 'not in use'
      this.log(
        `${indent}${shown(`${image.repository}:${image.tag}`).padEnd(60)} ${megabytes(image.size_bytes).padStart(8)} ${age(image.age_seconds).padStart(6)}  ${use}`,
      )
    }
    if (images.length === 0) this.log(`${indent}no meepagateway images`)
  }
}

function megabytes(bytes: number): string {
  return `${Math.round(bytes / 1e6)} MB`
}

function age(seconds: number): string {
  if (seconds < 3600) return `${Math.round(seconds / 60)}m`
  if (seconds < 86_400) return `${Math.round(seconds / 3600)}h`
  return `${Math.round(seconds / 86_400)}d`
}
