import {BaseCommand} from '../base-command.js'
import {listGatewayImages, type GatewayImage} from '../../runtime/container/status.js'

export default class ContainerImages extends BaseCommand<typeof ContainerImages> {
  static summary = 'list every meepagateway image with its tag, size, age and whether it is in use'
  static examples = ['<%= config.bin %> container images', '<%= config.bin %> container images --json']

  async run(): Promise<GatewayImage[]> {
    const images = await listGatewayImages(this.loadConfig())
    for (const image of images) {
      const use = image.in_use
        ? `in use${image.used_by.length > 0 ? ` by ${image.used_by.join(', ')}` : ''}`
        : 'not in use'
      this.log(
        `${`${image.repository}:${image.tag}`.padEnd(60)} ${megabytes(image.size_bytes).padStart(8)} ${age(image.age_seconds).padStart(6)}  ${use}`,
      )
    }
    if (images.length === 0) this.log('no meepagateway images')
    return images
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
