import path from 'node:path'
import {fileURLToPath} from 'node:url'

/** The installed app's root (holds bin/, dist/, node_modules/); src/ and dist/ sit one level below it. */
export const APP_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
