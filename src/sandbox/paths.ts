import fs from 'node:fs'
import path from 'node:path'

/** True when `child` is `parent` or lies beneath it (both absolute, normalised). */
export function isWithin(child: string, parent: string): boolean {
  if (child === parent) return true
  if (parent.endsWith(path.sep)) return child.startsWith(parent)
  // `parent + sep` as a prefix, without building that string (the policy compiler asks this thousands of times)
  return child.length > parent.length && child[parent.length] === path.sep && child.startsWith(parent)
}

export function isStrictlyWithin(child: string, parent: string): boolean {
  return child !== parent && isWithin(child, parent)
}

/**
 * Every `parent` with isStrictlyWithin(child, parent), as strings (so also for unnormalised ones):
 * O(length), no scan of a list.
 */
export function stringAncestors(child: string): string[] {
  const ancestors: string[] = []
  for (let i = child.indexOf(path.sep); i !== -1; i = child.indexOf(path.sep, i + 1)) {
    ancestors.push(child.slice(0, i))
    if (i + 1 < child.length) ancestors.push(child.slice(0, i + 1))
  }
  return ancestors
}

/**
 * One policy compile's view of the file system (compilePolicy runs inside): each path is lstat'ed
 * and resolved once, where the compile asked for the same ones again and again (a deny and its
 * entry, each grant's and deny's ancestors: ≈ 300 lstat and 150 realpath calls for a default
 * policy). The compile is synchronous: the answers are one moment's, as they were before.
 */
let memo: {lstat: Map<string, fs.Stats | undefined | Error>; real: Map<string, string | Error>} | undefined

export function withPathMemo<T>(compile: () => T): T {
  if (memo) return compile()
  memo = {lstat: new Map(), real: new Map()}
  try {
    return compile()
  } finally {
    memo = undefined
  }
}

/** lstat, undefined when missing; an Error for any other failure. */
function lstatOf(file: string): fs.Stats | undefined | Error {
  const known = memo?.lstat.get(file)
  if (known !== undefined || memo?.lstat.has(file)) return known
  let result: fs.Stats | undefined | Error
  try {
    result = fs.lstatSync(file, {throwIfNoEntry: false}) // most misses are ENOENT: no exception to build
  } catch (error) {
    result = error as Error
  }
  memo?.lstat.set(file, result)
  return result
}

function realpathOf(file: string): string {
  let result = memo?.real.get(file)
  if (result === undefined) {
    try {
      result = fs.realpathSync.native(file)
    } catch (error) {
      result = error as Error
    }
    memo?.real.set(file, result)
  }
  if (result instanceof Error) throw result
  return result
}

/**
 * Resolves every symlink of a path. A missing path resolves its longest existing ancestor and
 * keeps the missing tail as written, so a rule on it still lands where the kernel would look.
 */
export function canonicalPath(input: string): string {
  const absolute = path.resolve(input)
  let existing = absolute
  const tail: string[] = []
  for (;;) {
    try {
      // what lstat finds missing realpath cannot resolve either: no exception to build for it
      if (lstatOf(existing) !== undefined) {
        const real = realpathOf(existing)
        return tail.length === 0 ? real : path.join(real, ...tail.reverse())
      }
    } catch {
      // not resolvable (a loop, no permission): resolve its parent instead
    }
    const parent = path.dirname(existing)
    if (parent === existing) return absolute
    tail.push(path.basename(existing))
    existing = parent
  }
}

/**
 * The entry itself when the path is a symlink: its parent canonicalised, its own name kept.
 * A deny on a symlink covers both the link (it cannot be replaced) and its target.
 */
export function canonicalEntry(input: string): string {
  const absolute = path.resolve(input)
  const parent = path.dirname(absolute)
  return parent === absolute ? absolute : path.join(canonicalPath(parent), path.basename(absolute))
}

export type EntryKind = 'dir' | 'file' | 'symlink' | 'missing'

export function entryKind(file: string): EntryKind {
  const stat = lstatOf(file)
  if (!stat || stat instanceof Error) return 'missing'
  if (stat.isSymbolicLink()) return 'symlink'
  return stat.isDirectory() ? 'dir' : 'file'
}

/** entryKind from a directory listing's entry, without an lstat of its own. */
export function direntKind(entry: fs.Dirent): EntryKind {
  if (entry.isSymbolicLink()) return 'symlink'
  return entry.isDirectory() ? 'dir' : 'file'
}

/** Expands `~` (the operator's home) and resolves relative paths against `base`. */
export function expandConfigPath(input: string, operatorHome: string, base: string): string {
  if (input === '~') return operatorHome
  if (input.startsWith('~/')) return path.join(operatorHome, input.slice(2))
  return path.resolve(base, input)
}
