import path from 'node:path'
import {fileURLToPath} from 'node:url'

/** The installed app's root (holds bin/, dist/, node_modules/); src/ and dist/ sit one level below it. */
export const APP_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..')

/** This code runs from src/ (tsx, vitest), not from a build; the bundles replace this module and say false. */
export const FROM_SOURCE = import.meta.url.endsWith('.ts')
