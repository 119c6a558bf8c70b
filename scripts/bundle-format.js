// The file format both bundlers write (scripts/bundle-cli.js, scripts/bundle-agent-run.js) and
// bin/cli-bundle.cjs loads with a V8 code cache:
// - each file is its own CommonJS wrapper function, the script's completion value, so the loader
//   compiles it as is (no second string of the whole bundle for Module.wrap); Node's require()
//   (oclif requiring dist/cli.cjs, tests) still runs it, through the footer;
// - pure ASCII, so the loader can read it as latin1, a string Node keeps outside the V8 heap;
// - one namespace object per Node built-in module, however many modules import it.
import fs from 'node:fs'

/**
 * esbuild's `define` for `import.meta.url`, which CommonJS does not have (the SQLite addon's lookup
 * and the config validator's helpers resolve from it): a getter, as most starts never ask, and
 * pathToFileURL loads Node's URL machinery.
 */
export const IMPORT_META_URL = {'import.meta.url': '__bundleMeta.url'}

/** esbuild's banner and footer. */
export function selfWrapping() {
  return {
    banner: {
      js:
        "var __meepaCli = function (exports, require, module, __filename, __dirname) {\nvar __bundleMeta = {get url() { return require('node:url').pathToFileURL(__filename).href }};" +
        // finishBundle's shared namespace of a built-in module (esbuild's __toESM is defined below it)
        'var __builtinNamespaces = {}, __builtinNamespace = (id) => __builtinNamespaces[id] ??= __toESM(require(id), 1);',
    },
    footer: {
      js: "};\nif (typeof module === 'object' && module && module.exports) __meepaCli(exports, require, module, __filename, __dirname);\n__meepaCli",
    },
  }
}

/**
 * Rewrites a written bundle into the format above: see shareBuiltinNamespaces and makeAscii.
 */
export function finishBundle(file) {
  const text = fs.readFileSync(file, 'utf8')
  const finished = makeAscii(shareBuiltinNamespaces(text))
  if (finished !== text) fs.writeFileSync(file, finished)
}

/**
 * esbuild gives each module that imports a built-in its own copy of the built-in's exports
 * (`__toESM(require("node:fs"), 1)`: a getter per export, ≈ 100 for node:fs), and a start evaluates
 * dozens of those. A built-in's exports are complete when it is required, so one copy per built-in
 * reads the same values.
 */
export function shareBuiltinNamespaces(text) {
  return text.replace(/(?<![\w$])__toESM\(require\(("node:[a-z0-9_/]+")\),\s*1\)/g, '__builtinNamespace($1)')
}

/**
 * Escapes what esbuild leaves non-ASCII (its `charset: ascii` skips regular expression literals,
 * e.g. ansis's /[\x1b\u009b].../ written with the raw characters) as \uXXXX: the same value in a
 * string, a template, a regular expression or an identifier, and read as latin1 it stays itself.
 */
export function makeAscii(text) {
  return text.replace(/[\x80-\uffff]/g, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`)
}
