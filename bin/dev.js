#!/usr/bin/env -S node --import tsx --no-warnings
// Runs the commands from src/ through tsx (not the bundle bin/run.js loads). Help texts still
// come from oclif.manifest.json, which the build writes: run `npm run build` after changing flags.
import {execute} from '@oclif/core'
import {readFileSync} from 'node:fs'
import {fileURLToPath} from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const pjson = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
pjson.oclif = {...pjson.oclif, commands: './dist/commands', plugins: ['@oclif/plugin-help']}
await execute({development: true, dir: import.meta.url, loadOptions: {root, pjson}})
