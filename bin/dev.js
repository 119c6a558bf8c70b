#!/usr/bin/env -S node --import tsx --no-warnings
'use strict'
// Runs the commands from src/ through tsx (not the bundle bin/run.js loads). Help texts still
// come from oclif.manifest.json, which the build writes: run `npm run build` after changing flags.
const {execute} = require('@oclif/core')
const path = require('node:path')

const root = path.join(__dirname, '..')
const pjson = require('../package.json')
pjson.oclif = {...pjson.oclif, commands: './dist/commands', plugins: ['@oclif/plugin-help']}
execute({development: true, dir: __filename, loadOptions: {root, pjson}})
