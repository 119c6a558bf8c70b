#!/usr/bin/env node
// Records the digest of the files an isolation image gets from this app (dist/app-digest.json),
// with each file's size and mtime, so checking that an isolation image is up to date does not read
// and hash them at every `container status` or `send` (computeAppHash reads them again when any
// differs). Run last by `npm run build` (and by the test setup), after everything it covers is built.
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const {recordAppDigest} = await import(path.join(root, 'dist', 'sandbox', 'docker', 'app-bundle.js'))
await recordAppDigest(root)
