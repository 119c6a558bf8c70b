import {Ajv, type ValidateFunction} from 'ajv'
import {CONFIG_AJV_OPTIONS, CONFIG_SCHEMA} from './schema.js'

/**
 * The config schema's validator, compiled here when running from source. `npm run build`
 * replaces this module in dist/ with the same validator precompiled by ajv
 * (scripts/build-config-validator.js): compiling the schema costs ~80 ms at every CLI start.
 */
export const validateConfigSchema: ValidateFunction = new Ajv(CONFIG_AJV_OPTIONS).compile(CONFIG_SCHEMA)
