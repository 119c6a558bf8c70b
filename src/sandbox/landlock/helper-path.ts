import path from 'node:path'
import {APP_ROOT} from '../../runtime/util/app-root.js'

/**
 * The compiled helper; `npm run build` puts it there (scripts/build-native.js). Own module: naming
 * it loads no process library.
 */
export function helperPath(appRoot: string = APP_ROOT): string {
  return path.join(appRoot, 'dist', 'native', 'meepa-sandbox')
}
